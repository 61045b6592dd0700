"""Serving: the SavedModel a run exports."""
