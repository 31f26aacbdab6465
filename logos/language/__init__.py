"""The LOGOS language: the formal grammar, the shared tokenizer, vocabulary extension of a base model."""
