# Would FLUX.2's model-level modulation GEMVs gain from a second stream? (GPU; PyTorch only)
#   python3 bench/experiments/modulation_overlap.py [--json OUT.json]
# Flux2Transformer2DModel.forward computes silu(temb) @ W.T for three Flux2Modulation linears (6144 ->
# 36864 twice, 6144 -> 18432: 1.13 GB of bf16 weights read at M = 1) before x_embedder (128 -> 6144
# over the image tokens) and context_embedder (15360 -> 6144 over the text tokens), which do not depend
# on them. In one stream the GEMVs (memory-bound) and the embedders (compute-bound) run one after the
# other; on two streams (a fork and a join captured in one CUDA graph) the embedders could run under
# the GEMVs. Each kernel's numbers do not depend on what runs beside it, so the outputs stay equal
# (checked with torch.equal). Times: bench/torch_bench_common.py's rotated_graph_us, each form
# captured alone (the weights are over 20x the L2: no replay reads them warm).
import argparse, json, pathlib, sys
import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from torch_bench_common import rotated_graph_us  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--json")
ap.add_argument("--image-tokens", type=int, default=4096)
ap.add_argument("--text-tokens", type=int, default=512)
args = ap.parse_args()
dev, bf = "cuda", torch.bfloat16
torch.manual_seed(0)
D = 6144
temb = torch.randn(1, D, device=dev, dtype=bf)
w_mods = [torch.randn(n, D, device=dev, dtype=bf) * 0.01 for n in (6 * D, 6 * D, 3 * D)]
w_x = torch.randn(D, 128, device=dev, dtype=bf) * 0.05
w_ctx = torch.randn(D, 15360, device=dev, dtype=bf) * 0.01
img = torch.randn(1, args.image_tokens, 128, device=dev, dtype=bf)
txt = torch.randn(1, args.text_tokens, 15360, device=dev, dtype=bf)
side = torch.cuda.Stream()


def modulations():
    return [F.linear(F.silu(temb), w) for w in w_mods]


def embedders():
    return F.linear(img, w_x), F.linear(txt, w_ctx)


def one_stream():
    return modulations() + list(embedders())


def two_streams():
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        mods = modulations()
    emb = embedders()
    torch.cuda.current_stream().wait_stream(side)
    return mods + list(emb)


def parts():
    yield "modulations only", modulations
    yield "embedders only", lambda: list(embedders())
    yield "one stream", one_stream
    yield "two streams", two_streams


res = {name: rotated_graph_us([fn]) for name, fn in parts()}
equal = all(torch.equal(a, b) for a, b in zip(one_stream(), two_streams()))
print(torch.cuda.get_device_name(), f"image tokens {args.image_tokens}, text tokens {args.text_tokens}")
for name, us in res.items():
    print(f"  {name:18s} {us:9.2f} us")
print(f"  two streams save {res['one stream'] - res['two streams']:.2f} us; outputs torch.equal: {equal}")
if args.json:
    with open(args.json, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "us": res, "equal": equal,
                   "image_tokens": args.image_tokens, "text_tokens": args.text_tokens}, f, indent=1)
