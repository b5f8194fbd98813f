"""CSV and PNG output of the benchmarks (rank 0 only).

PNGs need matplotlib (``pip install 'spmdnet[bench]'``); without it the
CSV is still written and one line says the PNG was skipped.
"""
import csv
import os

INSTALL_HINT = "pip install 'spmdnet[bench]'"


def _cell(value):
    if isinstance(value, float):
        return f"{value:.6g}"
    return value


def write_csv(path, columns, rows):
    """Write ``rows`` (dicts keyed by ``columns``) to ``path``; returns the path."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for row in rows:
            writer.writerow([_cell(row.get(c, "")) for c in columns])
    return path


def read_csv(path):
    """Rows of a CSV as dicts of strings."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def pyplot():
    """matplotlib.pyplot on the Agg backend, or None when matplotlib is missing."""
    try:
        import matplotlib  # noqa: PLC0415 - optional
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415 - optional
    except ImportError:
        return None
    return plt


def write_png(path, draw, figsize=(9, 4), log=print):
    """Call ``draw(fig)`` on a new figure and save it to ``path``; returns the
    path, or None (after a one-line note) when matplotlib is missing."""
    plt = pyplot()
    if plt is None:
        log(f"PNG skipped (matplotlib is not installed: {INSTALL_HINT}): {path}")
        return None
    fig = plt.figure(figsize=figsize)
    try:
        draw(fig)
        fig.tight_layout()
        fig.savefig(path, dpi=80)
    finally:
        plt.close(fig)
    return path


def save(args, name, columns, rows, plot=None, figsize=(9, 4), log=print):
    """Write ``rows`` to ``args.out``/name.csv and, given a ``plot`` (a
    ``draw(fig)`` function) and no ``args.no_png``, the PNG name.png;
    logs each path written."""
    log("wrote", write_csv(f"{args.out}/{name}.csv", columns, rows))
    if plot is not None and not args.no_png:
        png = write_png(f"{args.out}/{name}.png", plot, figsize=figsize, log=log)
        if png:
            log("wrote", png)
