"""Task data: the task registry and loaders (``core``), tagging tasks (``tagging``), custom files (``files``),
and how each task's metric is shown (``scores``)."""
