"""The bottom room: what the data side and the model side share, importing neither.

The data spec, the normaliser, feature and column names, image resizing, atomic writes,
local/remote file access and run storage.
"""
