"""The I/O shell: workdirs, checkpoints, metric logs, TensorBoard, plots, export."""
