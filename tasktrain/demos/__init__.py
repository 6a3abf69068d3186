"""Small models and datasets for examples, bug reports and tests, under Lightning's names
(`lightning.pytorch.demos.boring_classes` -> `tasktrain.demos.boring_classes`)."""
