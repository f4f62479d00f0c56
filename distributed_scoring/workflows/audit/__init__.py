"""`dscore audit`: score a corpus snapshot, then figures, outliers, a baseline comparison and a report."""
