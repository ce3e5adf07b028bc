"""The data pipeline: from released corpora to padded batches of token ids.

    prepare      download WMT14 English-German and write plain train/valid/test text files
    reading      a text file read once: refused before reading unless it can be read as asked,
                 gzip sniffed from the same stream, lines of bounded length
    corpus       read aligned text (plain, gzipped, WMT SGML), never silently misaligned
    clean        drop empty, too short/long and badly proportioned pairs (Moses' rules)
    vocab        the joint sentencepiece BPE vocabulary, with fixed special ids
    encoded      corpora encoded once, cached as memory-mapped NumPy arrays
    batching     token-count batches for training (optionally with BPE-dropout), fixed-size
                 ordered batches for evaluation
    text         a text file as language-model tokens (characters or BPE), in random blocks

This is host-side code: it uses NumPy deliberately, not the array backend, because batches are
assembled on the CPU (from memory-mapped files) and only then handed to the model, which moves
them to the device. It is the only part of the library besides the backend that imports numpy.

Errors caused by the data (missing or corrupt files, misaligned corpora, a vocabulary with other
special ids) raise :class:`DataError`, a ``ValueError`` whose message says what to fix.
"""

from .batching import (BatchPlan, SubwordDropout, collate, epoch_batches, eval_arrays,
                       eval_batches, iterate_batches, token_batches)
from .clean import CleanOptions, CleanReport, clean_parallel
from .corpus import (ParallelReader, ParallelText, file_stamp, parallel_files, read_lines,
                     read_parallel, read_parallel_files, read_sgm, require_pairs)
from .encoded import EncodedCorpus, encode_corpus
from .prepare import prepare_wmt14
from .reading import DataError, check_input, raw_lines
from .text import TextData, load_text, random_blocks, validation_blocks
from .tokenizers import BPETokenizer, CharTokenizer, load_tokenizer
from .vocab import Vocab, cached_joint_vocab, train_joint_vocab, train_vocab

__all__ = [
    "DataError",
    "ParallelReader", "ParallelText", "file_stamp", "parallel_files", "require_pairs",
    "check_input", "raw_lines", "read_lines", "read_parallel",
    "read_parallel_files", "read_sgm",
    "CleanOptions", "CleanReport", "clean_parallel",
    "Vocab", "train_vocab", "train_joint_vocab", "cached_joint_vocab",
    "EncodedCorpus", "encode_corpus",
    "BatchPlan", "token_batches", "eval_batches", "collate", "iterate_batches", "epoch_batches",
    "eval_arrays", "SubwordDropout",
    "prepare_wmt14",
    "CharTokenizer", "BPETokenizer", "TextData", "load_text", "load_tokenizer", "random_blocks",
    "validation_blocks",
]
