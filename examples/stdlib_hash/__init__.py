"""blitzq demo: hash every file of the Python standard library through a real worker."""
