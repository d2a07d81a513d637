"""What a dataset holds (`Dataset.kind`), which decides the default model, step, evaluation
and what a run is scored by. No torch here: the records and reports read these too."""

IMAGES = "images"  # x: (N, C, H, W) floats, y: class labels
TEXT = "text"  # windows of bytes (vocabulary 256): the loss reads as bits per byte too
TOKENS = "tokens"  # windows of token ids
REGRESSION = "regression"  # y: floating-point targets, (N,) or (N, outputs)
LANGUAGE = (TEXT, TOKENS)  # windows of tokens: the model is given all but the last
LOSS_KINDS = (*LANGUAGE, REGRESSION)  # scored by their loss, not an accuracy
