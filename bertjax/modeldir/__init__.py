"""A model directory, below training: its files, its parameters read by path, and whether a model
fits a run. Checkpoints (`bertjax.training.checkpoint`) and init_checkpoint build on it;
`bertjax.convert` and the feature and data tasks read models through it alone."""
