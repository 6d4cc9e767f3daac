"""Reference computer-vision trainer: transfer learning on a class-folder image data set,
on one GPU, a fraction of one, a CPU, or many workers in data-parallel (torchrun env contract).

Nothing here is imported by the rest of gpupool at import time: torch loads only when a
`train`, `predict` or `data` command runs. Entry points: `trainer.train(config)`,
`predict.predict_files(...)`, `digits.export_digits(...)`, `imagenet.extract_synsets(...)`.

Owns: models, data loading, the training loop, checkpoints, export and prediction, and
`storage`, the one module that opens paths by URL (s3://, gs://, az://, file://; jobs/ calls it too).
May import: core only (it knows the distributed env contract, nothing of the pool); torch and
torchvision.
"""
