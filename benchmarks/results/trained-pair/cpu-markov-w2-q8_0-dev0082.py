"""Developer 0082 on the CPU developer engine: a draft whose markov_w2 is Q8_0 drafts its chain in one op;
against the same draft with the chain's separate ops (LLAMA_DSPARK_MARKOV_FUSED=0) and the draft with
markov_w2 in F16: drafted / accepted, text, and the log's word on the chain."""
import json, os, re, subprocess, sys, time, urllib.request
SRV = sys.argv[1]; T = sys.argv[2]; arms = [a.split("=", 1) for a in sys.argv[3:]]
prompts = json.load(open("/work/main/ggufdspark/data/trained/prompts.json"))
def run(name, spec, port=18133):
    env = dict(os.environ)
    draft, _, envs = spec.partition(",")
    for kv in filter(None, envs.split(",")):
        k, v = kv.split(":"); env[k] = v
    log = open(f"/tmp/mk/w2-{name}.log", "w")
    p = subprocess.Popen([SRV, "-m", T, "-md", draft, "--spec-type", "draft-dspark", "--spec-draft-n-max", "7",
                          "--spec-draft-n-min", "0", "-c", "4096", "-np", "1", "--host", "127.0.0.1", "--port", str(port),
                          "-t", "2", "-v"], stdout=subprocess.DEVNULL, stderr=log, env=env)
    try:
        for _ in range(600):
            try: urllib.request.urlopen(f"http://127.0.0.1:{port}/health"); break
            except Exception: time.sleep(0.1)
        outs, dn, da = [], 0, 0
        for pr in prompts:
            body = json.dumps({"prompt": pr, "n_predict": 128, "temperature": 0, "cache_prompt": False}).encode()
            r = json.load(urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/completion", body,
                                                                        {"Content-Type": "application/json"})))
            outs.append(r["content"]); dn += r["timings"].get("draft_n", 0); da += r["timings"].get("draft_n_accepted", 0)
    finally:
        p.terminate(); p.wait(); log.close()
    said = [l.strip() for l in open(f"/tmp/mk/w2-{name}.log") if "greedy Markov chain" in l]
    return outs, dn, da, said
res = {}
for name, spec in arms:
    res[name] = run(name, spec)
    o, dn, da, said = res[name]
    print(f"{name}: drafted {dn} accepted {da}; log: {said[:1]}")
first = arms[0][0]
for name, _ in arms[1:]:
    print(f"{name}: same text as {first}: {sum(a == b for a, b in zip(res[name][0], res[first][0]))} / {len(prompts)}")
