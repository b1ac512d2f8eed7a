"""The records of a publish: each file, each repo, the whole plan and the result."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class PlannedFile:
    role: str  # "target", "mmproj", "draft" or "card"
    path_in_repo: str
    size: int
    sha256: str
    local: str | None = None  # None for the card (built in memory)
    quant: str | None = None
    action: str = "upload"  # "upload", "skip" (same sha256 on the Hub)


@dataclass
class RepoPlan:
    repo_id: str
    private: bool
    files: list[PlannedFile]
    card: str
    exists: bool | None = None  # None: the Hub was not asked (dry run)
    head: str | None = None  # commit the upload builds on
    warnings: list[str] = field(default_factory=list)

    @property
    def to_upload(self) -> list[PlannedFile]:
        return [f for f in self.files if f.action == "upload"]


@dataclass
class PublishPlan:
    repos: list[RepoPlan]
    commands: dict[str, str]  # backend -> llama-server command line, for the first target
    dry_run: bool
    endpoint: str  # as shown: without the user:password@ of the URL (publish talks to the one given)
    pairing: dict[str, str] = field(default_factory=dict)  # target quant -> draft quant
    # target quant -> {"cuda": llama-server line, "metal": ..., "serve": ggufdspark serve line}
    quant_commands: dict[str, dict[str, str]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class PublishResult:
    plan: PublishPlan
    commits: dict[str, str | None] = field(default_factory=dict)  # repo -> commit URL, None: up to date

    def to_dict(self) -> dict[str, Any]:
        return {"plan": self.plan.to_dict(), "commits": self.commits}
