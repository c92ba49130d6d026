"""Figures (matplotlib, Agg backend): each module draws one family of figures."""

import matplotlib

matplotlib.use("Agg")
