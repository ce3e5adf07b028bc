"""The special token ids, the same in every vocabulary and every model.

    PAD_ID = 0   padding: ignored by the loss, masked out of attention
    UNK_ID = 1   a piece the vocabulary does not know
    BOS_ID = 2   begins the decoder input
    EOS_ID = 3   ends every source and target sentence

The vocabularies (data/vocab.py) are trained with these ids, the synthetic tasks (tasks.py) write
them, and the models take them as the defaults of their configs: one definition, below all of
them.
"""

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
