import json, subprocess, sys, time, urllib.request, os
SRV = os.path.expanduser("~/.cache/ggufdspark/engine/0c1e570-cpu-4fd3dc258b/build/bin/llama-server")
T = os.environ.get("T", os.path.expanduser("~/.cache/ggufdspark/demo/trained-lfm2-F16.gguf"))
prompts = json.load(open("/work/main/ggufdspark/data/trained/prompts.json"))[:12]
def run(draft, port, nmax=7):
    p = subprocess.Popen([SRV, "-m", T, "-md", draft, "--spec-type", "draft-dspark", "--spec-draft-n-max", str(nmax),
                          "--spec-draft-n-min", "0", "-c", "4096", "-np", "1", "--host", "127.0.0.1", "--port", str(port), "-t", "2"],
                         stdout=subprocess.DEVNULL, stderr=open(f"log-{port}.txt", "w"))
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health"); break
            except Exception: time.sleep(0.1)
        outs = []; dn = da = 0
        for pr in prompts:
            body = json.dumps({"prompt": pr, "n_predict": 128, "temperature": 0, "cache_prompt": False}).encode()
            r = json.load(urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/completion", body, {"Content-Type": "application/json"})))
            outs.append(r["content"]); dn += r["timings"].get("draft_n", 0); da += r["timings"].get("draft_n_accepted", 0)
        return outs, dn, da
    finally:
        p.terminate(); p.wait()
res = {}
for name, d in [(a.split("=")[0], a.split("=")[1]) for a in sys.argv[1:]]:
    res[name] = run(d, 18123)
    o, dn, da = res[name]
    print(f"{name}: drafted {dn} accepted {da} ({da/max(dn,1):.3f})")
names = list(res)
for n in names[1:]:
    print(n, "same text as", names[0], ":", sum(a == b for a, b in zip(res[n][0], res[names[0]][0])), "/", len(prompts))
