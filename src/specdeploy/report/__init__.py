"""Reports derived from run directories only: terminal tables, JSON and a self-contained HTML page."""
