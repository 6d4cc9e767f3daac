"""gpupool: pool GPUs and share them fractionally between training jobs."""

__version__ = "0.1.0"
