"""Reading: files and folders into tensors and settings (checkpoint, families, hyperparams, identify); nothing runs here."""
