"""What keeps the data side's files whole: atomic writes and locks, the skip log, decode failures found mid-run,
the image verification, text files read with their damage named, and pickled caches."""
