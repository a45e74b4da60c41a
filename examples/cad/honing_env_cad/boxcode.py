"""The two programs the cad grader runs in `cad` sandbox boxes (stdlib + build123d only; they are
source text here, never imported on the host).

BUILD (the candidate's box). A grader-owned runner, started before any candidate code: it reads
its public spec, opens the nonce file and unlinks it (so no later process can open it), makes itself
non-dumpable (no /proc/<runner>/{mem,fd} for the candidate), imports build123d (warm cells have it
preloaded: the import is free), then forks the candidate process. Only after the fork does it read
the nonce, so the candidate's copy of the runner's memory never holds it. The candidate process
(stdin /dev/null, stdout+stderr a pipe to the runner, every other fd closed but its result pipe)
runs the script in a fresh `__main__` namespace and sends back `result` exported as BREP over its
pipe. The runner enforces the wall time with SIGKILL, caps what it reads, kills every other process
of the box and prints one line, `<nonce> <json>`, with the BREP (zlib + base64), the candidate's
output (as data) and any error. What the candidate controls: its own process (monkeypatching
build123d or OCP there changes nothing the grader measures) and the BREP bytes it sends, which are
only ever parsed again as data, in another box.

MEASURE (a box with no candidate code). Loads the candidate's BREP, builds the reference from its
program (or loads the cached reference BREP), and measures both: solids, is_valid, exact bounding
box, volume, area, face/edge/cylindrical-face counts, and IoU by OCCT booleans,
vol(a & b) / (vol(a) + vol(b) - vol(a & b)) (= vol(a & b) / vol(a | b) for solids). Optionally
whether each of a list of probe points is inside the candidate (the build tool's stated-feature
checks, features.py) and a hidden-line SVG from a fixed isometric view. The reference never enters the candidate's box.
"""

BUILD_SRC = r'''
import os, sys, json, time, signal, ctypes, select, io, zlib, base64, traceback
G = "/work/.grader"
with open(G + "/spec.json") as fh:
    SPEC = json.load(fh)
NONCE_FD = os.open(G + "/nonce", os.O_RDONLY)
for name in os.listdir(G):
    os.unlink(G + "/" + name)
os.rmdir(G)
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
DUMPABLE = libc.prctl(3, 0, 0, 0, 0)
INFRA = None
if DUMPABLE != 0:
    INFRA = "runner cannot make itself non-dumpable"
else:
    try:
        import build123d
        from build123d import Shape, BuildPart, export_brep
    except Exception as e:  # a broken toolchain: infrastructure, never a grade
        INFRA = "cannot import build123d in the cad box: %s: %s" % (type(e).__name__, str(e)[:300])
src = open("/work/" + SPEC["script"], encoding="utf-8", errors="replace").read() if INFRA is None else ""

def child(res_w, out_w):
    os.setsid()
    nul = os.open("/dev/null", os.O_RDONLY)
    os.dup2(nul, 0)
    os.dup2(out_w, 1)
    os.dup2(out_w, 2)
    os.dup2(res_w, 3)
    os.closerange(4, 1 << 16)
    res = os.fdopen(3, "wb")
    def send(meta, blob=b""):
        res.write(json.dumps(meta).encode() + b"\n" + blob)
        res.flush()
        os._exit(0)
    sys.argv = ["part.py"]
    try:
        code = compile(src, "part.py", "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as e:
        send({"ok": False, "stage": "syntax", "error": "%s: %s (line %s)" % (type(e).__name__, e.msg if hasattr(e, "msg") else e, getattr(e, "lineno", "?"))})
    import __main__ as _m
    ns = {"__name__": "__main__", "__file__": "/work/part.py", "__builtins__": __builtins__}
    try:
        exec(code, ns)
    except BaseException as e:
        try:
            traceback.print_exc()
            sys.stderr.flush()
        except BaseException:
            pass
        send({"ok": False, "stage": "run", "error": "%s: %s" % (type(e).__name__, str(e)[:300])})
    r = ns.get("result")
    if r is None:
        send({"ok": False, "stage": "result", "error": "the script left no variable `result` (assign the finished part to `result`)"})
    if isinstance(r, BuildPart):
        r = r.part
    if not isinstance(r, Shape):
        send({"ok": False, "stage": "result", "error": "`result` is a %s, not a build123d solid" % type(r).__name__})
    solids = r.solids()
    if len(solids) != 1:
        send({"ok": False, "stage": "result", "error": "`result` must be exactly one solid; it has %d" % len(solids)})
    buf = io.BytesIO()
    export_brep(solids[0], buf)
    send({"ok": True}, buf.getvalue())

def main():
    if INFRA is not None:
        return {"infra": INFRA}
    res_r, res_w = os.pipe()
    out_r, out_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(res_r); os.close(out_r); os.close(NONCE_FD)
            child(res_w, out_w)
        finally:
            os._exit(0)
    os.close(res_w); os.close(out_w)
    deadline = time.monotonic() + float(SPEC["timeout_s"])
    bufs = {res_r: bytearray(), out_r: bytearray()}
    caps = {res_r: int(SPEC["max_brep_bytes"]) + 4096, out_r: int(SPEC["max_output_bytes"])}
    over = {res_r: False, out_r: False}
    live = [res_r, out_r]
    timed_out = False
    while live:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        ready, _, _ = select.select(live, [], [], left)
        for fd in ready:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                live.remove(fd)
                continue
            room = caps[fd] - len(bufs[fd])
            if room > 0:
                bufs[fd] += chunk[:room]
            if len(chunk) > room:
                over[fd] = True
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
    os.waitpid(pid, 0)
    out = bytes(bufs[out_r]).decode("utf-8", "replace")
    rep = {"output": out, "output_truncated": over[out_r]}
    if timed_out:
        rep.update(built=False, stage="timeout", error="the script ran past its %gs limit and was killed" % SPEC["timeout_s"])
        return rep
    raw = bytes(bufs[res_r])
    head, nl, blob = raw.partition(b"\n")
    try:
        meta = json.loads(head.decode()) if nl else None
    except ValueError:
        meta = None
    if type(meta) is not dict:
        rep.update(built=False, stage="crash", error="the script's process died without a result (exit, signal or memory limit)")
    elif meta.get("ok") is not True:
        rep.update(built=False, stage=str(meta.get("stage", "run"))[:20], error=str(meta.get("error", ""))[:600])
    elif over[res_r] or len(blob) > int(SPEC["max_brep_bytes"]):
        rep.update(built=False, stage="result", error="the part's BREP is larger than %d bytes" % SPEC["max_brep_bytes"])
    else:
        rep.update(built=True, brep=base64.b64encode(zlib.compress(blob, 6)).decode())
    return rep

#KILL_OTHERS#
rep = main()
rep["clean"] = kill_others()
nonce = os.read(NONCE_FD, 256).decode().strip()
os.write(1, (nonce + " " + json.dumps(rep) + "\n").encode())
'''

MEASURE_SRC = r'''
import os, sys, json, zlib, base64, math
G = "/work/.grader"
with open(G + "/spec.json") as fh:
    SPEC = json.load(fh)
with open(G + "/nonce") as fh:
    NONCE = fh.read().strip()

def emit(obj):
    os.write(1, (NONCE + " " + json.dumps(obj) + "\n").encode())
    os._exit(0)

try:
    import build123d as bd
except Exception as e:
    emit({"infra": "cannot import build123d in the cad box: %s: %s" % (type(e).__name__, str(e)[:300])})

def measure(shape):
    solids = shape.solids()
    bb = shape.bounding_box(optimal=True)
    return {"solids": len(solids), "valid": bool(shape.is_valid), "volume": float(shape.volume),
            "area": float(shape.area), "faces": len(shape.faces()), "edges": len(shape.edges()),
            "cylinders": len(shape.faces().filter_by(bd.GeomType.CYLINDER)),
            "bbox_min": [bb.min.X, bb.min.Y, bb.min.Z], "bbox_max": [bb.max.X, bb.max.Y, bb.max.Z]}

def load(path):
    with open(path, "rb") as fh:
        data = zlib.decompress(fh.read())
    tmp = "/tmp/shape.brep"
    with open(tmp, "wb") as fh:
        fh.write(data)
    return bd.import_brep(tmp)

out = {}
try:
    cand = load("/work/.grader/cand.brepz")
    out["cand"] = measure(cand)
except Exception as e:
    emit({"cand_error": "the part could not be read back: %s: %s" % (type(e).__name__, str(e)[:200])})
ref = None
if SPEC.get("ref") == "program":
    ns = {"__name__": "__reference__"}
    try:
        exec(compile(open("/work/.grader/ref.py").read(), "reference.py", "exec"), ns)
        ref = ns["result"]
        ref = ref.solids()[0] if len(ref.solids()) == 1 else ref
        import io
        buf = io.BytesIO()
        bd.export_brep(ref, buf)
        out["ref_brep"] = base64.b64encode(zlib.compress(buf.getvalue(), 6)).decode()
    except Exception as e:
        emit({"infra": "the reference program failed: %s: %s" % (type(e).__name__, str(e)[:300])})
elif SPEC.get("ref") == "brep":
    ref = load("/work/.grader/ref.brepz")
if ref is not None:
    out["ref"] = measure(ref)
    if out["cand"]["valid"] and out["cand"]["solids"] == 1:
        try:
            inter = cand & ref
            vi = float(inter.volume) if inter is not None else 0.0
            vu = out["cand"]["volume"] + out["ref"]["volume"] - vi
            out["iou"] = max(0.0, min(1.0, vi / vu)) if vu > 0 else 0.0
        except Exception as e:
            out["iou"] = None
            out["iou_error"] = "%s: %s" % (type(e).__name__, str(e)[:200])
if SPEC.get("probes"):
    try:
        out["inside"] = [bool(cand.is_inside(tuple(float(x) for x in p))) for p in SPEC["probes"]]
    except Exception as e:
        out["probe_error"] = "%s: %s" % (type(e).__name__, str(e)[:200])
if SPEC.get("render"):
    try:
        vis, hid = cand.project_to_viewport((150, -200, 120), viewport_up=(0, 0, 1))
        exp = bd.ExportSVG(margin=5, line_weight=0.25)
        exp.add_layer("hidden", line_color=(160, 160, 160), line_type=bd.LineType.ISO_DOT)
        exp.add_shape(vis)
        exp.add_shape(hid, layer="hidden")
        exp.write("/tmp/render.svg")
        out["svg"] = open("/tmp/render.svg").read()
        out["render"] = {"visible_edges": len(vis), "hidden_edges": len(hid)}
    except Exception as e:
        out["render_error"] = "%s: %s" % (type(e).__name__, str(e)[:200])
emit(out)
'''


def build_src() -> str:
    from honing.verify.code import KILL_OTHERS_SRC

    return BUILD_SRC.replace("#KILL_OTHERS#\n", KILL_OTHERS_SRC)
