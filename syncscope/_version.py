"""syncscope's version, in a module of its own: what records or prints it imports this,
never the package root (which imports the public API above everything else)."""

__version__ = "0.2.0"
