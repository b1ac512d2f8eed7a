"""A small Hugging Face Hub on 127.0.0.1, for tests that cannot reach the network.

It serves the part of the Hub API that the real ``huggingface_hub`` client (2.x) and llama.cpp's
``-hf`` downloader call, and keeps what they send in memory so tests can check what arrived:

    with FakeHub(token="hf_...") as hub:          # binds 127.0.0.1 on port 0
        os.environ["HF_ENDPOINT"] = hub.url
        ...                                       # create_repo / create_commit / hf_hub_download
        hub.files("org/name")                     # {path: bytes} at the head commit

Endpoints (the paths the clients build, read from their sources):
  POST /api/repos/create                             huggingface_hub create_repo
  POST /api/validate-yaml                            create_commit, when README.md is committed
  GET  /api/models/{repo}[/revision/{rev}]           model_info / repo_info (siblings, sha)
  GET  /api/models/{repo}/refs                       llama.cpp: the commit of main
  GET  /api/models/{repo}/tree/{rev}[/{path}]        list_repo_tree; llama.cpp's file listing
  POST /api/models/{repo}/preupload/{rev}            upload mode (lfs / regular) + remote oid
  POST /{repo}.git/info/lfs/objects/batch            LFS batch API, "basic" transfer only
  PUT  /_storage/{oid}                               the object store the batch API points to
  POST /{repo}.git/info/lfs/objects/verify           LFS verify step
  POST /api/models/{repo}/commit/{rev}               ndjson commit (file / lfsFile / deletedFile)
  GET|HEAD /{repo}/resolve/{rev}/{path}              downloads (Range supported; a gated repo's
                                                     only with the token: 401 GatedRepo without one,
                                                     403 with another, as the Hub answers)

Not served: Xet storage (clients must run with ``HF_HUB_DISABLE_XET=1``), datasets and Spaces,
pull requests, pagination beyond one page. Commits are atomic: an ``lfsFile`` whose object was
never uploaded rejects the whole commit and the repo does not change.

A hostile mirror: a test puts a ``StoredFile`` under any name into ``hub.repos[id].head.files``, or
gives a ``Commit`` any ``oid``; the listings and routes serve them as they are (a revision is matched
still quoted, as one path segment, the way the Hub routes it).
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

# Files routed to LFS in a new repo (a subset of the patterns the Hub writes into .gitattributes).
GITATTRIBUTES = "".join(f"{p} filter=lfs diff=lfs merge=lfs -text\n" for p in (
    "*.bin", "*.gguf", "*.safetensors", "*.pt", "*.pth", "*.onnx", "*.zip", "*.tar.*", "*.npy"))
# Beyond this size the Hub wants LFS whatever the name (regular files are limited to 10 MB).
REGULAR_MAX = 10 * 1024 * 1024
REPO_ID = r"(?P<repo>[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+?)"


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(oid: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {size}\n".encode()


@dataclass
class StoredFile:
    path: str
    size: int
    data: bytes | None = None  # a regular (git) file
    lfs_oid: str | None = None  # sha256 of an LFS object

    @property
    def blob_id(self) -> str:
        if self.lfs_oid is not None:
            return git_blob_sha1(lfs_pointer(self.lfs_oid, self.size))
        return git_blob_sha1(self.data or b"")

    def tree_entry(self) -> dict:
        e = {"type": "file", "path": self.path, "size": self.size, "oid": self.blob_id}
        if self.lfs_oid is not None:
            e["lfs"] = {"oid": self.lfs_oid, "size": self.size,
                        "pointerSize": len(lfs_pointer(self.lfs_oid, self.size))}
        return e


@dataclass
class Commit:
    oid: str
    parent: str | None
    summary: str
    files: dict[str, StoredFile]


@dataclass
class Repo:
    repo_id: str
    private: bool
    commits: list[Commit] = field(default_factory=list)
    gated: bool = False  # files download only with the hub's token (its metadata and listing stay public)

    @property
    def head(self) -> Commit:
        return self.commits[-1]

    def at(self, rev: str) -> Commit | None:
        if rev in ("main", "refs/heads/main"):
            return self.head
        return next((c for c in self.commits if c.oid == rev or (len(rev) >= 7 and c.oid.startswith(rev))), None)


class HubError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


class FakeHub:
    """The server and its state. ``token``: the one write token it accepts (None: no auth)."""

    def __init__(self, token: str | None = None, host: str = "127.0.0.1"):
        self.token = token
        self.repos: dict[str, Repo] = {}
        self.objects: dict[str, bytes] = {}  # LFS store: sha256 -> bytes
        self.fail_uploads: set[str] = set()  # sha256 oids whose PUT is refused (403, not retried)
        # downloads broken on purpose: path -> how many GETs send half their body and drop the connection;
        # then GETs of the paths in refuse_downloads answer 503 (HEAD requests stay fine)
        self.cut_downloads: dict[str, int] = {}
        self.refuse_downloads: set[str] = set()
        self.requests: list[tuple[str, str, int]] = []  # (method, path, status)
        # 'hang' mode: requests whose "METHOD /path" matches this regex are read and never answered
        # (the connection stays open until stop()), a Hub that accepts and then says nothing
        self.hang: str | None = None
        self.hung: list[str] = []  # "METHOD /path" of each request left hanging
        self.released = threading.Event()
        self.lock = threading.RLock()
        self._n_commits = 0
        self._server = ThreadingHTTPServer((host, 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "FakeHub":
        self._thread = threading.Thread(target=self._server.serve_forever, name="fakehub", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.released.set()  # hanging requests end (unanswered) so their threads finish
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(10)
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> "FakeHub":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------------ what tests look at
    def files(self, repo_id: str, rev: str = "main") -> dict[str, bytes]:
        """Every file of ``repo_id`` at ``rev``, LFS objects resolved to their bytes."""
        commit = self.repos[repo_id].at(rev)
        assert commit is not None, f"{repo_id}: no revision {rev}"
        return {p: self._content(f) for p, f in commit.files.items()}

    def commits(self, repo_id: str) -> list[Commit]:
        return list(self.repos[repo_id].commits)

    def calls(self, method: str, pattern: str) -> list[str]:
        """Paths of the requests with this method whose path matches ``pattern`` (a regex)."""
        return [p for m, p, _ in self.requests if m == method and re.search(pattern, p)]

    # ------------------------------------------------------------------ state changes
    def create_repo(self, repo_id: str, private: bool = False) -> Repo:
        with self.lock:
            repo = Repo(repo_id, private)
            data = GITATTRIBUTES.encode()
            repo.commits.append(Commit(self._new_oid(repo_id), None, "initial commit",
                                       {".gitattributes": StoredFile(".gitattributes", len(data), data)}))
            self.repos[repo_id] = repo
            return repo

    def _new_oid(self, seed: str) -> str:
        self._n_commits += 1
        return hashlib.sha1(f"{seed}:{self._n_commits}".encode()).hexdigest()

    def _content(self, f: StoredFile) -> bytes:
        return self.objects[f.lfs_oid] if f.lfs_oid is not None else (f.data or b"")

    def _upload_mode(self, head: Commit, path: str, size: int, sample: bytes) -> str:
        attrs = head.files.get(".gitattributes")
        patterns = [ln.split()[0] for ln in (attrs.data or b"").decode().splitlines()
                    if "filter=lfs" in ln] if attrs else []
        name = path.rsplit("/", 1)[-1]
        if any(fnmatch.fnmatch(name, p) or fnmatch.fnmatch(path, p) for p in patterns):
            return "lfs"
        return "lfs" if size > REGULAR_MAX or b"\0" in sample else "regular"

    def commit(self, repo: Repo, rev: str, lines: list[dict]) -> Commit:
        if not lines or lines[0].get("key") != "header":
            raise HubError(400, "the first line of a commit must be its header")
        header = lines[0]["value"]
        with self.lock:
            if rev not in ("main", "refs/heads/main"):
                raise HubError(404, f"revision {rev} not found", "RevisionNotFound")
            parent = header.get("parentCommit")
            if parent and not repo.head.oid.startswith(parent):
                raise HubError(412, "A commit has happened since. Please refresh and try again.")
            files = dict(repo.head.files)
            for line in lines[1:]:
                key, value = line.get("key"), line.get("value") or {}
                path = value.get("path", "")
                if not path or path.startswith("/") or ".." in path.split("/"):
                    raise HubError(400, f"invalid path {path!r}")
                if key == "file":
                    data = base64.b64decode(value["content"])
                    files[path] = StoredFile(path, len(data), data=data)
                elif key == "lfsFile":
                    oid, size = value.get("oid"), value.get("size")
                    obj = self.objects.get(oid)
                    if obj is None or (size is not None and len(obj) != size):
                        raise HubError(422, f"{path}: LFS object {oid} was not uploaded")
                    files[path] = StoredFile(path, len(obj), lfs_oid=oid)
                elif key == "deletedFile":
                    if files.pop(path, None) is None:
                        raise HubError(404, "A file with this name doesn't exist", "EntryNotFound")
                elif key == "deletedFolder":
                    files = {p: f for p, f in files.items() if not p.startswith(path.rstrip("/") + "/")}
                else:
                    raise HubError(400, f"unknown commit operation {key!r}")
            c = Commit(self._new_oid(repo.repo_id), repo.head.oid, header.get("summary", ""), files)
            repo.commits.append(c)
            return c


def _handler_for(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(_Handler):
        pass

    Handler.hub = hub
    return Handler


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the clients expect
    hub: FakeHub

    def log_message(self, fmt, *args):  # keep test output quiet; requests are recorded instead
        pass

    # ------------------------------------------------------------------ plumbing
    def _body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            out = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None,
              content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        for k, v in (headers or {}).items():
            self.send_header(k, str(v))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)
        self.hub.requests.append((self.command, self.path, status))

    def _json(self, obj, status: int = 200, headers: dict | None = None) -> None:
        self._send(status, json.dumps(obj).encode(), headers)

    def _authorized(self) -> bool:
        if self.hub.token is None:
            return True
        return self.headers.get("Authorization", "") == f"Bearer {self.hub.token}"

    def _need_auth(self) -> None:
        if not self._authorized():
            raise HubError(401, "Invalid credentials in Authorization header")

    def _repo(self, repo_id: str) -> Repo:
        repo = self.hub.repos.get(repo_id)
        if repo is None or (repo.private and not self._authorized()):
            raise HubError(404, "Repository not found", "RepoNotFound")
        return repo

    def _dispatch(self, routes) -> None:
        split = urlsplit(self.path)
        path, query = unquote(split.path), parse_qs(split.query)
        if self.hub.hang and re.search(self.hub.hang, f"{self.command} {path}"):
            self._body()  # the request is read in full, then nothing comes back
            with self.hub.lock:
                self.hub.hung.append(f"{self.command} {path}")
            self.hub.released.wait()
            self.close_connection = True
            return
        try:
            for method, pattern, fn in routes:
                if method != self.command:
                    continue
                # matched before unquoting, as the Hub routes: a revision quoted whole (``%2F``)
                # stays one path segment, whatever it holds
                m = re.fullmatch(pattern, split.path)
                if m:
                    return fn(self, query, **{k: unquote(v) if v else v for k, v in m.groupdict().items()})
            raise HubError(404, f"no route for {self.command} {path}")
        except HubError as e:
            headers = {"X-Error-Message": e.message}
            if e.code:
                headers["X-Error-Code"] = e.code
            self._json({"error": e.message}, e.status, headers)

    def do_GET(self):
        self._dispatch(ROUTES)

    def do_HEAD(self):
        self._dispatch(ROUTES)

    def do_POST(self):
        self._dispatch(ROUTES)

    def do_PUT(self):
        self._dispatch(ROUTES)

    # ------------------------------------------------------------------ Hub API
    def create_repo(self, query):
        self._need_auth()
        body = json.loads(self._body() or b"{}")
        if body.get("type", "model") != "model":
            raise HubError(400, "only model repos are served here")
        repo_id = f"{body['organization']}/{body['name']}" if body.get("organization") else f"fake-user/{body['name']}"
        url = f"{self.hub.url}/{repo_id}"
        with self.hub.lock:
            if repo_id in self.hub.repos:
                return self._json({"error": "You already created this model repo", "url": url}, 409)
            private = body.get("visibility") == "private" or bool(body.get("private"))
            self.hub.create_repo(repo_id, private)
        self._json({"url": url, "name": repo_id, "id": repo_id})

    def validate_yaml(self, query):
        body = json.loads(self._body() or b"{}")
        text = body.get("content", "")
        errors = []
        m = re.match(r"^---\n(.*?)\n---\n", text, re.DOTALL)
        if m:
            try:
                meta = yaml.safe_load(m.group(1))
                if not isinstance(meta, dict):
                    errors.append({"message": "metadata must be a YAML mapping"})
            except yaml.YAMLError as e:
                errors.append({"message": f"invalid YAML: {e}"})
        status = 400 if errors else 200
        self._json({"errors": errors, "warnings": []}, status)

    def model_info(self, query, repo, rev="main"):
        r = self._repo(repo)
        c = r.at(rev)
        if c is None:
            raise HubError(404, f"revision {rev} not found", "RevisionNotFound")
        siblings = []
        for f in c.files.values():
            s = {"rfilename": f.path, "size": f.size, "blobId": f.blob_id}
            if f.lfs_oid:
                s["lfs"] = {"size": f.size, "sha256": f.lfs_oid, "pointerSize": len(lfs_pointer(f.lfs_oid, f.size))}
            siblings.append(s)
        self._json({"id": repo, "modelId": repo, "sha": c.oid, "private": r.private, "siblings": siblings,
                    "tags": [], "author": repo.split("/")[0], "gated": "manual" if r.gated else False})

    def refs(self, query, repo):
        r = self._repo(repo)
        self._json({"branches": [{"name": "main", "ref": "refs/heads/main", "targetCommit": r.head.oid}],
                    "tags": [], "converts": []})

    def tree(self, query, repo, rev, sub=None):
        sub = sub or ""
        r = self._repo(repo)
        c = r.at(rev)
        if c is None:
            raise HubError(404, f"revision {rev} not found", "RevisionNotFound")
        recursive = (query.get("recursive") or ["false"])[0].lower() in ("1", "true")
        prefix = sub.strip("/") + "/" if sub.strip("/") else ""
        out, folders = [], set()
        for p, f in sorted(c.files.items()):
            if not p.startswith(prefix):
                continue
            rest = p[len(prefix):]
            if recursive or "/" not in rest:
                out.append(f.tree_entry())
            if "/" in rest:
                parts = rest.split("/")[:-1]
                for i in range(1, (len(parts) if recursive else 1) + 1):
                    folders.add(prefix + "/".join(parts[:i]))
        out += [{"type": "directory", "path": d, "oid": hashlib.sha1(d.encode()).hexdigest(), "size": 0}
                for d in sorted(folders)]
        if prefix and not out:
            raise HubError(404, f"{sub} not found", "EntryNotFound")
        self._json(out)

    def preupload(self, query, repo, rev):
        self._need_auth()
        r = self._repo(repo)
        c = r.at(rev)
        if c is None:
            raise HubError(404, f"revision {rev} not found", "RevisionNotFound")
        body = json.loads(self._body() or b"{}")
        files = []
        for f in body.get("files", []):
            sample = base64.b64decode(f.get("sample", ""))
            mode = self.hub._upload_mode(c, f["path"], int(f.get("size", 0)), sample)
            cur = c.files.get(f["path"])
            oid = None if cur is None else (cur.lfs_oid if cur.lfs_oid is not None else cur.blob_id)
            files.append({"path": f["path"], "uploadMode": mode, "shouldIgnore": False, "oid": oid})
        self._json({"files": files, "commitOid": c.oid})

    def lfs_batch(self, query, repo):
        self._need_auth()
        self._repo(repo)
        body = json.loads(self._body() or b"{}")
        if body.get("operation") != "upload" or "basic" not in body.get("transfers", ["basic"]):
            raise HubError(400, "only the basic upload transfer is served here")
        objects = []
        for o in body.get("objects", []):
            oid, size = o["oid"], int(o["size"])
            if not re.fullmatch(r"[0-9a-f]{64}", oid):
                objects.append({"oid": oid, "size": size, "error": {"code": 422, "message": "invalid oid"}})
            elif oid in self.hub.objects and len(self.hub.objects[oid]) == size:
                objects.append({"oid": oid, "size": size})  # already stored: no actions
            else:
                objects.append({"oid": oid, "size": size, "authenticated": True, "actions": {
                    "upload": {"href": f"{self.hub.url}/_storage/{oid}?size={size}"},
                    "verify": {"href": f"{self.hub.url}/{repo}.git/info/lfs/objects/verify"}}})
        self._send(200, json.dumps({"transfer": "basic", "objects": objects}).encode(),
                   content_type="application/vnd.git-lfs+json")

    def storage_put(self, query, oid):
        # a pre-signed object-store URL: it needs no Hub token, and the client sends none
        data = self._body()
        if oid in self.hub.fail_uploads:
            raise HubError(403, "upload refused (failure injected by the test)")
        if hashlib.sha256(data).hexdigest() != oid:
            raise HubError(400, f"content does not hash to {oid}")
        with self.hub.lock:
            self.hub.objects[oid] = data
        self._send(200, b"", {"ETag": f'"{oid[:32]}"'})

    def lfs_verify(self, query, repo):
        self._need_auth()
        body = json.loads(self._body() or b"{}")
        obj = self.hub.objects.get(body.get("oid"))
        if obj is None or len(obj) != body.get("size"):
            raise HubError(404, f"object {body.get('oid')} not stored")
        self._json({"success": True})

    def commit(self, query, repo, rev):
        self._need_auth()
        r = self._repo(repo)
        if not self.headers.get("Content-Type", "").startswith("application/x-ndjson"):
            raise HubError(400, "commit payload must be application/x-ndjson")
        lines = [json.loads(ln) for ln in self._body().splitlines() if ln.strip()]
        c = self.hub.commit(r, rev, lines)
        self._json({"success": True, "commitOid": c.oid, "commitUrl": f"{self.hub.url}/{repo}/commit/{c.oid}",
                    "hookOutput": ""})

    def resolve(self, query, repo, rev, path):
        r = self._repo(repo)
        c = r.at(rev)
        if c is None:
            raise HubError(404, f"revision {rev} not found", "RevisionNotFound")
        f = c.files.get(path)
        if f is None:
            raise HubError(404, f"{path} not found", "EntryNotFound")
        if r.gated and not self._authorized():
            # what the Hub answers: 401 without a token, 403 with one that is not on the list
            if self.headers.get("Authorization"):
                raise HubError(403, f"Access to model {repo} is restricted and you are not in the authorized "
                               f"list. Visit {self.hub.url}/{repo} to ask for access.", "GatedRepo")
            raise HubError(401, f"Access to model {repo} is restricted. You must have access to it and be "
                           "authenticated to access it. Please log in.", "GatedRepo")
        data = self.hub._content(f)
        etag = f.lfs_oid or f.blob_id
        headers = {"ETag": f'"{etag}"', "X-Repo-Commit": c.oid, "Accept-Ranges": "bytes"}
        status, rng = 200, re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if rng and self.command == "GET":
            start = int(rng.group(1))
            end = int(rng.group(2)) if rng.group(2) else len(data) - 1
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            status, data = 206, data[start:end + 1]
        if self.command == "GET":
            with self.hub.lock:
                cut = self.hub.cut_downloads.get(path, 0)
                if cut:
                    self.hub.cut_downloads[path] = cut - 1
            if cut:
                return self._cut(status, data, headers)
            if path in self.hub.refuse_downloads:
                raise HubError(503, "Service unavailable (failure injected by the test)")
        self._send(status, data, headers, "application/octet-stream")

    def _cut(self, status: int, data: bytes, headers: dict) -> None:
        """Announce all of ``data``, send half of it, drop the connection (a download broken off)."""
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        for k, v in headers.items():
            self.send_header(k, str(v))
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data[:len(data) // 2])
        self.wfile.flush()
        self.close_connection = True
        self.hub.requests.append((self.command, self.path, -status))  # negative: cut short


ROUTES = [
    ("POST", r"/api/repos/create", _Handler.create_repo),
    ("POST", r"/api/validate-yaml", _Handler.validate_yaml),
    ("GET", rf"/api/models/{REPO_ID}/refs", _Handler.refs),
    ("GET", rf"/api/models/{REPO_ID}/tree/(?P<rev>[^/]+)(?P<sub>/.*)?", _Handler.tree),
    ("GET", rf"/api/models/{REPO_ID}/revision/(?P<rev>[^/]+)", _Handler.model_info),
    ("GET", rf"/api/models/{REPO_ID}", _Handler.model_info),
    ("POST", rf"/api/models/{REPO_ID}/preupload/(?P<rev>[^/]+)", _Handler.preupload),
    ("POST", rf"/api/models/{REPO_ID}/commit/(?P<rev>[^/]+)", _Handler.commit),
    ("POST", rf"/{REPO_ID}\.git/info/lfs/objects/batch", _Handler.lfs_batch),
    ("POST", rf"/{REPO_ID}\.git/info/lfs/objects/verify", _Handler.lfs_verify),
    ("PUT", r"/_storage/(?P<oid>[0-9a-f]{64})", _Handler.storage_put),
    ("GET", rf"/{REPO_ID}/resolve/(?P<rev>[^/]+)/(?P<path>.+)", _Handler.resolve),
    ("HEAD", rf"/{REPO_ID}/resolve/(?P<rev>[^/]+)/(?P<path>.+)", _Handler.resolve),
]
