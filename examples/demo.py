"""The README's main job: a real SmolLM2 answer on MLX, then a real stop (see abstract_client/demo.py).

pip install -e '.[mlx]' && python examples/demo.py
"""

from abstract_client.app.demo import run_demo

if __name__ == "__main__":
    raise SystemExit(run_demo())
