"""LOGOS stack: one token grammar for scientific objects, encoders/detokenizers, tokenizer, training and generation."""

__version__ = "0.1.0"
