"""A minitfm model as a CTranslate2 model directory (OpenNMT's inference engine).

CTranslate2 describes a model by a specification: named weights in a fixed layout. minitfm's
parameters map onto it one to one:

    minitfm                                 CTranslate2 (TransformerSpec / TransformerDecoderSpec)
    emb / src_emb, tgt_emb  (V, d)          encoder.embeddings[0], decoder.embeddings, and the
                                            output projection decoder.projection (tied: one array)
    the sinusoids (max_len, d)              {encoder,decoder}.position_encodings, given explicitly:
                                            ours interleave sine and cosine, CTranslate2's own
                                            table puts them in two halves
    pos_emb (L, d)  (learned, LM)           decoder.position_encodings
    *.w_qkv (d, 3d), b_qkv                  self_attention.linear[0]  (fused [Q | K | V])
    *.w_o, b_o                              self_attention.linear[1]  (attention.linear[2])
    cross_attn.w_q, b_q / w_kv, b_kv        attention.linear[0] / attention.linear[1]  ([K | V])
    ff.w1, b1 / ff.w2, b2                   ffn.linear_0 / ffn.linear_1
    ln1, ln2 (, ln3)                        self_attention.layer_norm, (attention.layer_norm),
                                            ffn.layer_norm: after the residual sum with post-LN,
                                            before the sub-layer with pre-LN
    enc.ln, dec.ln, layers.ln  (pre-LN)     {encoder,decoder}.layer_norm

Weights are transposed to CTranslate2's [out, in]; heads split the fused columns the same way
(Q, K, V blocks of d_model, each h blocks of d_k). The embedding is passed unscaled with
``scale_embeddings`` on: CTranslate2 multiplies by sqrt(d_model) itself, as ``model.embed``
does. LayerNorm epsilon 1e-5 (layers/layernorm.py). The source gets EOS appended
(``add_source_eos``) and decoding starts from ``<s>``, as in minitfm.

Decoding settings are arguments of ``translate_batch`` / ``generate_batch``, not part of the
model: they go to ``decoding.json`` beside it, chosen so that CTranslate2 searches as minitfm's
``beam.beam_search`` does with the same settings (read from CTranslate2's ``BeamSearch``):

- the score: CTranslate2 divides log P(Y, EOS) by |Y|^length_penalty, |Y| counting the EOS (its
  hypotheses keep the EOS while scored, and lose it afterwards): minitfm's power form, exactly.
  GNMT's ((5 + |Y|) / 6)^alpha has no CTranslate2 equivalent; :func:`ctranslate2_alpha` gives
  the exponent with the same slope in log length at a typical output length, with a warning.
- when a sentence is done: at length_penalty 0 CTranslate2 stops once the best candidate of a
  step ends in EOS, which gives the outputs of minitfm's exact rule; with a penalty it stops once
  round(beam_size * patience) hypotheses have finished, which is minitfm's first-k rule at
  patience 1 (at alpha 0 through a length_penalty that changes no score,
  ``UNIT_LENGTH_PENALTY``). minitfm's exact rule with a penalty settles on what a search to the
  length limit finds, so the call that reproduces it has a patience no count can reach (at most
  beam_size hypotheses finish per step): CTranslate2 then decodes every batch to
  max_decoding_length. The cases with no exact call (GNMT's penalty; exact stopping with a
  penalty at beam 1, where CTranslate2 decodes greedily) warn.
- at the length limit both finish a sentence's K best candidates as they are, and both score
  the one-row first step (BOS alone) before they expand it to K rows.
"""

from __future__ import annotations

import json
import os

import numpy

from minitfm import backend
from minitfm.decoding.beam import stopping_rule
from minitfm.export.source import ExportError, Loaded, model
from minitfm.layers import positional

QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16",
                 "bfloat16", "float32")
DECODING_FILE = "decoding.json"
SENTENCEPIECE_FILE = "sentencepiece.model"
TYPICAL_LENGTH = 20        # output tokens, for the length-penalty translation
# |Y|^1e-9 rounds to exactly 1 in float32 for every length (1 + 1e-9 ln |Y| is within half an
# ulp of 1): a length_penalty that changes no score, yet is not 0, so that CTranslate2 stops by
# counting finished hypotheses (first-k) rather than at the first best EOS
UNIT_LENGTH_PENALTY = 1e-9


def _import_ctranslate2():
    try:
        import ctranslate2
        import ctranslate2.specs
    except ImportError:
        raise ExportError("--to ctranslate2 needs the ctranslate2 package: "
                          "pip install -e '.[export]' (or pip install ctranslate2)") from None
    return ctranslate2


# ---- weights ----------------------------------------------------------------------------------

def sinusoids(length: int, d_model: int) -> numpy.ndarray:
    """minitfm's interleaved sine/cosine table, from layers/positional.py, on the host."""
    return backend.to_host(positional.encoding(length, d_model, numpy.float32))


def _linear(spec, params: dict, w: str, b: str) -> None:
    spec.weight = numpy.ascontiguousarray(params[w].T)         # (in, out) -> [out, in]
    spec.bias = params[b]


def _layer_norm(spec, params: dict, prefix: str) -> None:
    spec.gamma = params[prefix + "gamma"]
    spec.beta = params[prefix + "beta"]


def _self_attention(spec, params: dict, prefix: str, ln: str) -> None:
    _linear(spec.linear[0], params, prefix + "w_qkv", prefix + "b_qkv")
    _linear(spec.linear[1], params, prefix + "w_o", prefix + "b_o")
    _layer_norm(spec.layer_norm, params, ln)


def _feed_forward(spec, params: dict, prefix: str, ln: str) -> None:
    _linear(spec.linear_0, params, prefix + "w1", prefix + "b1")
    _linear(spec.linear_1, params, prefix + "w2", prefix + "b2")
    _layer_norm(spec.layer_norm, params, ln)


def _embedding(spec, table, positions) -> None:
    """The token table, unscaled (CTranslate2 multiplies by sqrt(d_model)), and the positions."""
    spec.embeddings.weight = table
    spec.scale_embeddings = True
    spec.position_encodings.encodings = positions


def translator_spec(params: dict, cfg: model.Config, src_tokens: list[str],
                    tgt_tokens: list[str]):
    """The ``TransformerSpec`` of an encoder-decoder model and its vocabularies (token strings,
    one per id, special tokens at minitfm's ids: <pad> <unk> <s> </s>)."""
    ct2 = _import_ctranslate2()
    specs = ct2.specs
    params = {k: numpy.asarray(v, dtype=numpy.float32) for k, v in params.items()}
    spec = specs.TransformerSpec.from_config(cfg.n_layers, cfg.n_heads, pre_norm=cfg.pre_ln)
    src_name, tgt_name = model.embedding_names(cfg)
    positions = sinusoids(cfg.max_len, cfg.d_model)
    enc, dec = spec.encoder, spec.decoder
    enc.embeddings[0].weight = params[src_name]
    enc.scale_embeddings = True
    enc.position_encodings.encodings = positions
    _embedding(dec, params[tgt_name], positions)
    dec.projection.weight = params[tgt_name]                    # the tied output projection
    for i, layer in enumerate(enc.layer):
        p = f"enc.{i}."
        _self_attention(layer.self_attention, params, p + "attn.", p + "ln1.")
        _feed_forward(layer.ffn, params, p + "ff.", p + "ln2.")
    for i, layer in enumerate(dec.layer):
        p = f"dec.{i}."
        _self_attention(layer.self_attention, params, p + "self_attn.", p + "ln1.")
        cross = p + "cross_attn."
        _linear(layer.attention.linear[0], params, cross + "w_q", cross + "b_q")
        _linear(layer.attention.linear[1], params, cross + "w_kv", cross + "b_kv")
        _linear(layer.attention.linear[2], params, cross + "w_o", cross + "b_o")
        _layer_norm(layer.attention.layer_norm, params, p + "ln2.")
        _feed_forward(layer.ffn, params, p + "ff.", p + "ln3.")
    if cfg.pre_ln:
        _layer_norm(enc.layer_norm, params, "enc.ln.")
        _layer_norm(dec.layer_norm, params, "dec.ln.")
    spec.config.layer_norm_epsilon = 1e-5
    spec.config.add_source_eos = True
    spec.config.decoder_start_token = "<s>"
    spec.register_source_vocabulary(src_tokens)
    spec.register_target_vocabulary(tgt_tokens)
    return spec


def language_model_spec(params: dict, cfg, tokens: list[str]):
    """The ``TransformerDecoderModelSpec`` of a decoder-only language model (models/lm.py)."""
    ct2 = _import_ctranslate2()
    params = {k: numpy.asarray(v, dtype=numpy.float32) for k, v in params.items()}
    spec = ct2.specs.TransformerDecoderModelSpec.from_config(
        cfg.n_layers, cfg.n_heads, pre_norm=cfg.pre_ln, no_final_norm=not cfg.pre_ln)
    dec = spec.decoder
    positions = params["pos_emb"] if cfg.learned_positions else sinusoids(cfg.max_len,
                                                                           cfg.d_model)
    _embedding(dec, params["emb"], positions)
    dec.projection.weight = params["emb"]
    for i, layer in enumerate(dec.layer):
        p = f"layers.{i}."
        _self_attention(layer.self_attention, params, p + "attn.", p + "ln1.")
        _feed_forward(layer.ffn, params, p + "ff.", p + "ln2.")
    if cfg.pre_ln:
        _layer_norm(dec.layer_norm, params, "layers.ln.")
    spec.config.layer_norm_epsilon = 1e-5
    spec.register_vocabulary(tokens)
    return spec


# ---- decoding settings --------------------------------------------------------------------------

def ctranslate2_alpha(alpha: float, length: int = TYPICAL_LENGTH) -> float:
    """The exponent b of CTranslate2's |Y|^b that ranks like GNMT's ((5 + |Y|) / 6)^alpha near
    |Y| = length: both penalties then change alike with the length (the same derivative of
    log lp in log |Y|: alpha |Y| / (5 + |Y|) = b)."""
    return alpha * length / (5.0 + length)


def decoding_settings(loaded: Loaded, beam: int, alpha: float, max_len: int | None,
                      warn, lenpen_form: str = "gnmt", stopping: str = "auto") -> dict:
    """The JSON written beside the model, and the keyword arguments of the matching call: the
    call that gives minitfm's search exactly where one exists, a warning where none does."""
    cfg = loaded.config
    limit = cfg.max_len if max_len is None else max_len
    if loaded.kind != model.KIND:
        return {"method": "generate_batch", "kwargs": generate_kwargs(limit), "minitfm": {
            "note": f"the prompt plus max_length must stay within the model's context of "
                    f"{cfg.max_len} tokens: CTranslate2 does not slide the window as minitfm "
                    f"does"}}
    exact, patience, stopping = True, 1, stopping_rule(stopping, alpha)
    length_penalty = alpha if lenpen_form == "power" else 0.0
    if alpha and lenpen_form == "gnmt" and beam > 1:
        exact, length_penalty = False, round(ctranslate2_alpha(alpha), 3)
        warn(f"minitfm's length penalty ((5 + |Y|) / 6)^alpha and CTranslate2's |Y|^alpha "
             f"agree only at alpha = 0; for outputs of about {TYPICAL_LENGTH} tokens "
             f"length_penalty={length_penalty} ranks like minitfm's alpha={alpha:g}, and is the "
             f"one written: translations may still differ from minitfm's. --lenpen-form power "
             f"scores as CTranslate2 does")
    if beam == 1 and alpha and stopping == "exact":
        exact = False
        warn("with beam 1 CTranslate2 decodes greedily, to the first EOS; minitfm's exact "
             "stopping with a length penalty may search past it: with --stopping first-k both "
             "decode greedily")
    elif beam > 1 and not alpha and stopping == "first-k":
        length_penalty = UNIT_LENGTH_PENALTY    # no score changes, but CTranslate2 counts
    elif beam > 1 and alpha and stopping == "exact":
        patience = limit + 1         # no count of finished hypotheses may stop CTranslate2 early
    call = translate_kwargs(beam, length_penalty, limit, cfg.max_len, patience)
    notes = ["minitfm stops each sentence after its source length + 50 tokens by default; "
             "CTranslate2 takes one max_decoding_length for all: give minitfm the same --max-len "
             "for the same translations"]
    if patience > 1:
        notes.append(f"patience {patience}: minitfm's exact stopping with a length penalty "
                     f"keeps what a search to the length limit finds, and so must CTranslate2, "
                     f"which then decodes every batch for max_decoding_length steps")
    return {"method": "translate_batch", "kwargs": call, "minitfm": {
        "beam": beam, "alpha": alpha, "lenpen_form": lenpen_form, "stopping": stopping,
        "max_len": max_len, "exact": exact, "note": " ".join(notes)}}


def translate_kwargs(beam: int, length_penalty: float, max_len: int, max_input: int,
                     patience: float = 1) -> dict:
    """``translate_batch``'s arguments that decode as ``beam.beam_search`` does (``beam=1``:
    ``decode.greedy``; see :func:`decoding_settings` for the penalty and the stopping rule): an
    empty output allowed (CTranslate2's default minimum is 1 token), at most ``max_len`` output
    tokens with EOS.

    minitfm never generates <pad> or <s>: it drops them after the softmax, so the scores stay
    log-probabilities of the model. CTranslate2 can only drop tokens before its softmax
    (``suppress_sequences``), which changes every score a little; so nothing is dropped here,
    and CTranslate2 would pick <pad> or <s> only where they rank among the best, which a trained
    model never does (neither is ever a training target). Add
    ``suppress_sequences=[["<pad>"], ["<s>"]]`` to rule them out at that small cost."""
    return {"beam_size": beam, "length_penalty": length_penalty, "patience": patience,
            "max_decoding_length": max_len, "min_decoding_length": 0,
            "max_input_length": max_input}


def generate_kwargs(max_new_tokens: int) -> dict:
    """``generate_batch``'s arguments that generate as ``generation.generate(..., greedy=True)``: the
    prompt's continuation only, every token of the vocabulary allowed, no stop token."""
    return {"max_length": max_new_tokens, "sampling_topk": 1, "include_prompt_in_result": False,
            "end_token": []}


def call_example(settings: dict) -> str:
    args = ", ".join(f"{k}={v!r}" for k, v in settings["kwargs"].items())
    return f"{settings['method']}(batch, {args})"


# ---- vocabularies -----------------------------------------------------------------------------

def vocabulary(loaded: Loaded, size: int) -> tuple[list[str], bytes | None]:
    """The token of each id (``size`` of them) and the sentencepiece model to copy, if any."""
    kind = (loaded.vocab_id or "").split(":", 1)[0]
    if loaded.vocab_model is None:
        raise ExportError(
            f"this checkpoint has no vocabulary (vocab_id {loaded.vocab_id!r}): a model of the "
            f"synthetic tasks reads and writes bare token ids, which CTranslate2 cannot take. "
            f"Export a model trained on text (train_wmt.py, train_lm.py), or export the weights "
            f"with --to safetensors")
    if loaded.kind == model.KIND or kind == "bpe":
        import sentencepiece
        try:
            sp = sentencepiece.SentencePieceProcessor(model_proto=loaded.vocab_model)
        except (RuntimeError, TypeError) as exc:
            raise ExportError(f"the checkpoint's vocabulary is not a sentencepiece model "
                              f"({exc})") from exc
        tokens, spm_bytes = [sp.id_to_piece(i) for i in range(sp.get_piece_size())], \
            loaded.vocab_model
    elif kind == "char":
        tokens, spm_bytes = list(loaded.vocab_model.decode("utf-8")), None
    else:
        raise ExportError(f"unknown vocabulary {loaded.vocab_id!r}: expected a sentencepiece or "
                          f"character vocabulary")
    if len(tokens) > size:
        raise ExportError(f"the vocabulary has {len(tokens)} tokens but the model only {size} "
                          f"embeddings: it is not the vocabulary the model was trained with")
    # ids the vocabulary never produces still need a (unique) name in CTranslate2's list
    tokens += [f"<unused_{i}>" for i in range(len(tokens), size)]
    if len(set(tokens)) != len(tokens):
        raise ExportError("the vocabulary names two ids alike; CTranslate2 maps tokens to ids "
                          "by name and cannot keep them apart")
    return tokens, spm_bytes


# ---- the export -------------------------------------------------------------------------------

def export(loaded: Loaded, directory: str, *, quantization: str | None = None, beam: int = 4,
           alpha: float = 0.6, max_len: int | None = None, lenpen_form: str = "gnmt",
           stopping: str = "auto", warn=print) -> dict:
    """Write the CTranslate2 model of ``loaded`` into the (new, empty) ``directory``: model.bin,
    config.json, the vocabulary, sentencepiece.model where there is one, and decoding.json.
    Returns the decoding settings."""
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ExportError(f"unknown quantization {quantization!r}: one of "
                          f"{', '.join(QUANTIZATIONS)}")
    cfg = loaded.config
    if max_len is not None and not 1 <= max_len <= cfg.max_len:
        raise ExportError(f"--max-len must be in [1, {cfg.max_len}] (the model's max_len)")
    if loaded.kind == model.KIND:
        src, src_spm = vocabulary(loaded, cfg.src_vocab)
        tgt, _ = vocabulary(loaded, cfg.tgt_vocab)
        spec = translator_spec(loaded.params, cfg, src, tgt)
    else:
        tokens, src_spm = vocabulary(loaded, cfg.vocab)
        spec = language_model_spec(loaded.params, cfg, tokens)
    settings = decoding_settings(loaded, beam, alpha, max_len, warn, lenpen_form, stopping)
    write_spec(spec, directory, quantization)
    if src_spm is not None:
        with open(os.path.join(directory, SENTENCEPIECE_FILE), "wb") as f:
            f.write(src_spm)
    settings["quantization"] = quantization or "float32"
    with open(os.path.join(directory, DECODING_FILE), "w", encoding="utf-8") as f:
        json.dump(settings, f, indent=2)
        f.write("\n")
    return settings


def write_spec(spec, directory: str, quantization: str | None = None) -> None:
    """Check a filled specification and save it into ``directory``."""
    try:
        spec.validate()
    except ValueError as exc:                  # a weight left unset: a mapping bug, said plainly
        raise ExportError(f"the CTranslate2 specification is incomplete: {exc}") from exc
    spec.optimize(quantization=quantization)
    spec.save(directory)

