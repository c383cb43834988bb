"""txl: a small, exact Transformer-XL you can watch remember."""

from .config import TXLConfig
from .model import TransformerXL, TXLOutput
from .tokenizer import CharTokenizer, UnknownCharactersError

__all__ = ["TXLConfig", "TransformerXL", "TXLOutput", "CharTokenizer", "UnknownCharactersError"]
