"""The tiny SentencePiece models of the Reformer tokenizer tests, of the kind
`google/reformer-crime-and-punishment` ships: the corpus they are trained on
(`CORPUS`) and `train_sentencepiece`."""

import io

# English prose in the manner of a nineteenth-century novel, with digits,
# punctuation and quotes, to train a BPE model with 200 pieces.
CORPUS = (
    "On an exceptionally hot evening early in July a young man came out of the garret in which he lodged.",
    "He walked slowly, as though in hesitation, towards the bridge over the canal.",
    "He had successfully avoided meeting his landlady on the staircase.",
    "His garret was under the roof of a high, five-storied house and was more like a cupboard than a room.",
    "The landlady who provided him with garret, dinners, and attendance lived on the floor below.",
    "Every time he went out he was obliged to pass her kitchen, the door of which invariably stood open.",
    '"What do you want?" she asked, and he answered that he wanted nothing at all.',
    "He was hopelessly in debt to her, 42 roubles and 3 copecks, and was afraid of meeting her.",
    "It was not that he was cowardly and abject; quite the contrary, but for some time past he had been in an "
    "overstrained, irritable condition.",
    "The heat in the street was terrible: and the airlessness, the bustle and the plaster everywhere.",
    "At 7 o'clock he left the tavern; the clock struck 8 as he crossed the square.",
    "Why am I going there now? Am I capable of that? Is that serious? It is not serious at all!",
    "She counted the money twice: 1, 2, 3, 10, 100 and 1,000, then she put it in a drawer.",
    "He stood still for a minute, then walked on, thinking of the old woman and her sister.",
    "The room into which the young man walked was a small room with yellow paper on the walls.",
    "There were geraniums and muslin curtains in the windows, and the setting sun shone into the room.",
    "Everything was very clean; the floor and the furniture were brightly polished.",
    "He felt that he was completely alone, and the thought of it made him tremble.",
    "In the evening he went back to his room, lay down on the sofa and slept until morning.",
    "Tomorrow, tomorrow, he said to himself; everything will be settled tomorrow.",
)


def train_sentencepiece(directory, model_type, vocab_size=200, **options):
    """Trains a SentencePiece model on `CORPUS` with SentencePiece's default
    settings (NMT NFKC normalization, `<unk>` 0, `<s>` 1, `</s>` 2) and
    writes it to `directory/spiece.model`."""
    import sentencepiece

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS * 3),
        model_writer=model,
        vocab_size=vocab_size,
        model_type=model_type,
        hard_vocab_limit=False,
        num_threads=1,
        minloglevel=2,
        **options,
    )
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "spiece.model"
    path.write_bytes(model.getvalue())
    return path
