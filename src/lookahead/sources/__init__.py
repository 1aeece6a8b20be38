"""Text that copying proposers take candidate continuations from.

``memory``     the token streams this process has generated or read (``TextMemory``)
``datastore``  a suffix array over a tokenised corpus on disk (``Datastore``)
"""
