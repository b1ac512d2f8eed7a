"""``publish``: put a checked target / DSpark draft pair (and an optional mmproj) on the Hugging Face
Hub, named so that ``llama-server -hf ORG/NAME-GGUF:F16 -hfd ORG/NAME-DSpark-GGUF:F16`` finds it,
with a model card per repo that says what the files are and how to run them.

    publish("t.gguf", "d.gguf", repo="org/Name", dry_run=True).plan     # nothing is sent
    publish("t.gguf", "d.gguf", repo="org/Name", on_plan=show).commits  # repo -> commit URL

Order of work: check the pair, hash the files, read what the Hub already holds (read-only), hand
the plan to ``on_plan``, then create the repos, upload every new LFS object of every repo, and only
then make one commit per repo. A failed upload therefore commits nothing anywhere; files whose
sha256 already matches on the Hub are not sent.

The parts:

* ``naming``: repo ids, file names, and which file llama.cpp's ``-hf`` / ``-hfd`` would take;
* ``records``: the plan's dataclasses (``PlannedFile``, ``RepoPlan``, ``PublishPlan``, ``PublishResult``);
* ``cards``: the model cards and the command lines in them;
* ``results``: ``bench`` / ``tune`` reports rendered for the cards;
* ``plan``: the upload plan, from local files alone (``plan_publish``, ``default_pairing``);
* ``hub``: the Hub calls (``publish``); ``masking``: the token kept out of every log line.
"""

from ggufdspark.publish.cards import (CARD_TAGS, Pair, human_size, license_from_gguf, llama_server_command,
                                      render_card, serve_command)
from ggufdspark.publish.hub import publish
from ggufdspark.publish.naming import (DRAFT_SUFFIX, FILE_NAME, MAX_REPO_NAME, REPO_ID_RE, SIDECAR_KEYWORDS,
                                       TARGET_SUFFIX, llama_cpp_pick, quant_label, repo_names, valid_repo_id)
from ggufdspark.publish.plan import default_pairing, plan_publish, resolution_warnings
from ggufdspark.publish.records import PlannedFile, PublishPlan, PublishResult, RepoPlan
from ggufdspark.publish.results import RESULT_LAYOUTS, ResultLayout, render_results
# default_pairing reads the measured draft per target quant from this table
from ggufdspark.quants import RECOMMENDED_DRAFT

__all__ = [
    "CARD_TAGS", "DRAFT_SUFFIX", "FILE_NAME", "MAX_REPO_NAME", "RECOMMENDED_DRAFT", "REPO_ID_RE", "RESULT_LAYOUTS",
    "SIDECAR_KEYWORDS", "TARGET_SUFFIX", "Pair", "PlannedFile", "PublishPlan", "PublishResult", "RepoPlan",
    "ResultLayout", "default_pairing", "human_size", "license_from_gguf", "llama_cpp_pick", "llama_server_command",
    "plan_publish", "publish", "quant_label", "render_card", "render_results", "repo_names", "resolution_warnings",
    "serve_command", "valid_repo_id",
]
