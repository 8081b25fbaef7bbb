"""The MLX lane's engine pieces (``providers/mlx.py`` is the lane): the loaded model handle
(``model``), continuous batching (``batch``), and the text the engine hands out (``output``)."""
