"""What an evaluation computes and keeps: metrics declared once, their intervals, heatmaps, metrics.json(l)."""
