"""Figures and how they are written: classification metrics, bootstrap intervals, the figure
format, plots. No model, no file format."""
