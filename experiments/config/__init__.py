"""What the config says: every key declared once, its check before TensorFlow starts, the typed Settings."""
