"""Export a trained model for use outside minitfm: ``python -m minitfm.export``.

    python -m minitfm.export model.npz --to ctranslate2 --out model-ct2 [--quantization int8]
    python -m minitfm.export model.npz --to safetensors --out model.safetensors
    python -m minitfm.export model.safetensors --from safetensors --out model.npz

- ``source``        reading a checkpoint through the compatibility check, and writing an output
                    whole or not at all
- ``ctranslate2``   the mapping onto CTranslate2's Transformer specifications, the vocabulary
                    and the decoding settings (needs the ``export`` extra)
- ``safetensors``   weights under their minitfm names, the configuration as metadata; and back
- ``__main__``      the command line

The extra: ``pip install -e ".[export]"`` brings ``ctranslate2`` and ``safetensors``.
"""
