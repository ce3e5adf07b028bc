"""Corpus BLEU with sacreBLEU: detokenized hypotheses against the raw reference text.

The paper reports BLEU on newstest2014 (section 6.1). Scores only compare when they are computed
the same way, so this module hands the *detokenized* output (``Vocab.decode``) and the reference
text *as released* to sacreBLEU, which tokenizes both with its own standard tokenizer and records
every setting in a signature such as ``nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.4.0``
(Post, 2018, "A Call for Clarity in Reporting BLEU Scores"). Print the signature with the score.

The paper's numbers come from tokenized BLEU (``multi-bleu.perl`` on its own tokenization, with
compound splitting for German); sacreBLEU's detokenized BLEU is usually somewhat lower for the
same output.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

__all__ = ["BleuScore", "corpus_bleu"]


@dataclass(frozen=True)
class BleuScore:
    """One corpus BLEU score and how it was computed."""

    bleu: float          # 0 .. 100
    signature: str       # sacreBLEU's settings, e.g. "nrefs:1|case:mixed|...|version:2.4.0"
    summary: str         # "BLEU = 27.30 58.9/33.1/20.8/13.5 (BP = 1.000 ratio = ...)"
    sentences: int

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return f"{self.summary}  [{self.signature}]"


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str], *,
                tokenize: str = "13a") -> BleuScore:
    """sacreBLEU's corpus BLEU of detokenized ``hypotheses`` against one reference each.

    ``tokenize`` is sacreBLEU's tokenizer ("13a", its default and WMT's, "intl", "none", ...).
    """
    if isinstance(hypotheses, str) or isinstance(references, str):
        raise TypeError("corpus_bleu takes lists of sentences, not a single string")
    if len(hypotheses) != len(references):
        raise ValueError(f"corpus_bleu: {len(hypotheses)} hypotheses but {len(references)} "
                         f"references; every hypothesis needs the reference of its sentence")
    if not hypotheses:
        raise ValueError("corpus_bleu: no sentences to score")
    # imported on the first score: a command that scores nothing (translating, averaging,
    # training without validation) starts without sacreBLEU and what it imports
    from sacrebleu.metrics import BLEU
    metric = BLEU(tokenize=tokenize)
    result = metric.corpus_score(list(hypotheses), [list(references)])
    return BleuScore(bleu=float(result.score), signature=str(metric.get_signature()),
                     summary=str(result), sentences=len(hypotheses))
