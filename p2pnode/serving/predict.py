"""Putting a node's model to use: `p2pnode predict` and `p2pnode export`, and the node's side of
the control socket's `predict` command (docs/usage.md).

`predict` reads each image file here (at most `[node].predict_max_image_mb`) and sends the files
to the running node, `[node].predict_max_images` per request. The node decodes them exactly as
it decoded its own images (algorithms/models/inference.py) and classifies them with a frozen copy of
what its last evaluation scored, so its training goes on meanwhile and its answers agree with
its reported accuracy. With no node running, the node's checkpoint is loaded into the model its
configuration describes, and the same is done here.

`export` writes that model, from the checkpoint, as a `torch.export` program that plain torch
loads, with the class names and the preprocessing inside (the extra file `p2pnode.json`) and
beside it (FILE.json).
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from ..files import describe_os_error, write_atomically
from ..learning.checkpoint import CHECKPOINT_NAME, Checkpoint, CheckpointError
from ..operations.control import MAX_REQUEST_BYTES, ControlError, NotRunning, request

if TYPE_CHECKING:
    from algorithms.interface import LocalData, Predictors
    from algorithms.models.inference import KnownClasses, Prediction, Preprocessing

    from ..config import Config, NodeSettings
    from ..learning.driver import RoundDriver

__all__ = [
    "PREDICT",
    "METADATA_NAME",
    "EXPORT_FORMAT",
    "PredictError",
    "UsableModel",
    "LiveModel",
    "answer_predict",
    "checkpoint_model",
    "control_request_bytes",
    "export_model",
    "predict_files",
]

PREDICT = "predict"  # the control command
METADATA_NAME = "p2pnode.json"  # the exported program's extra file
EXPORT_FORMAT = "p2pnode-model/1"
PREDICT_TIMEOUT_S = 120.0  # one request: decoding its images and one forward pass, on the node's device
_LOCAL_BATCH = 64  # images classified at once from the checkpoint


class PredictError(Exception):
    """No prediction can be made; the message says why and what to do."""


def max_image_bytes(settings: NodeSettings) -> int:
    return int(settings.predict_max_image_mb * 2**20)


def _base64_length(size: int) -> int:
    return 4 * math.ceil(size / 3)


def control_request_bytes(settings: NodeSettings) -> int:
    """The largest request the control socket takes: a `predict` of the most images, each of
    the largest size, base64 in JSON."""
    return MAX_REQUEST_BYTES + settings.predict_max_images * (_base64_length(max_image_bytes(settings)) + 4)


def class_names(config: Config) -> tuple[str, ...]:
    """What each class id of the node means: its `[data].class_names`, or its dataset's."""
    from algorithms.data.datasets import class_names as dataset_class_names

    return config.data.class_names or dataset_class_names(config.data.dataset)


@dataclass(frozen=True)
class UsableModel:
    """A node's predictor, frozen, how an image file becomes its input, and which images it
    calls one of its classes."""

    predictors: Predictors
    preprocessing: Preprocessing
    known: KnownClasses
    class_names: tuple[str, ...]
    algorithm: str
    round: int  # the round whose evaluation scored it

    @classmethod
    def of(cls, predictors: Predictors, data: LocalData, config: Config, algorithm: str, round: int) -> UsableModel:
        """`predictors` with their unknown-image threshold set on the node's held-out images `data`."""
        from algorithms.models.inference import KnownClasses, Preprocessing

        known = KnownClasses.calibrate(predictors, data, config.node.predict_unknown_quantile)
        return cls(predictors, Preprocessing.of(data), known, class_names(config), algorithm, round)

    def classify(self, blobs: Sequence[bytes]) -> list[dict[str, Any]]:
        """For each image file's bytes: its class, the class's name and probability, whether it
        is one of the node's classes (and if not, why not); or an error for a file that cannot
        be decoded."""
        from algorithms.data.own_data import OwnDataError
        from algorithms.models.inference import classify

        decoded, answers = [], []
        for blob in blobs:
            try:
                decoded.append(self.preprocessing.decode(io.BytesIO(blob)))
                answers.append(None)
            except OwnDataError as exc:
                answers.append({"error": str(exc)})
        images = self.preprocessing.batch(decoded) if decoded else None
        results = iter(classify(self.predictors, images, self.known.classes) if decoded else ())
        for index, answer in enumerate(answers):
            if answer is None:
                answers[index] = self._answer(next(results))
        return answers

    def _answer(self, prediction: Prediction) -> dict[str, Any]:
        known = self.known.covers(prediction)
        answer = {
            "class": prediction.label,
            "class_name": self.class_names[prediction.label],
            "probability": prediction.probability,
            "known": known,
            "own_probability": prediction.own_probability,
        }
        if not known:
            answer["why_unknown"] = self.known.why_not(prediction, self.class_names)
        return answer

    def input_pngs(self, blobs: Sequence[bytes]) -> list[bytes]:
        """Image files (each one `classify` decoded) as the model's input, a PNG each."""
        return [self.preprocessing.png(self.preprocessing.decode(io.BytesIO(blob))) for blob in blobs]

    def about(self) -> dict[str, Any]:
        return {
            "algorithm": self.algorithm,
            "predictor": self.predictors.chosen,
            "round": self.round,
            **self.known.describe(self.class_names),
        }


# --- the node's side ------------------------------------------------------------------------


# Asks the learning peers about images (asking.py's Asking.ask_about): model, files, this node's results for them.
AskPeers = Callable[["UsableModel", list[bytes], list[dict[str, Any]]], Awaitable[dict[str, Any]]]


async def answer_predict(request: dict, live: LiveModel, ask_peers: AskPeers | None = None) -> dict[str, Any]:
    """The control command `predict`: `images`, a list of base64-encoded image files, at most
    `[node].predict_max_images` of at most `[node].predict_max_image_mb` each; one answer per
    image, in order. With `ask_peers` true, the images the node calls not one of its classes
    are put to its learning peers (asking.py) and their answers go with them."""
    try:
        blobs = _request_images(request, live.config.node)
        model = await trio.to_thread.run_sync(live.get)
    except PredictError as exc:
        return {"ok": False, "error": str(exc)}
    results = await trio.to_thread.run_sync(model.classify, blobs)
    about = model.about()
    if request.get("ask_peers") is True:
        if ask_peers is None:
            return {"ok": False, "error": "this node does not learn ([algorithm].name is none): it has no peers to ask"}
        unknown = [index for index, result in enumerate(results) if result.get("known") is False]
        try:
            about["asked"] = await ask_peers(model, [blobs[i] for i in unknown], [results[i] for i in unknown])
        except PredictError as exc:
            return {"ok": False, "error": str(exc)}
    return {"ok": True, **about, "results": results}


def _request_images(request: dict, settings: NodeSettings) -> list[bytes]:
    images = request.get("images")
    if not isinstance(images, list) or not images or not all(isinstance(image, str) for image in images):
        raise PredictError("expected `images`: a list of base64-encoded image files")
    if len(images) > settings.predict_max_images:
        raise PredictError(f"{len(images)} images; at most [node].predict_max_images ({settings.predict_max_images})")
    limit = max_image_bytes(settings)
    blobs = []
    for index, text in enumerate(images):
        if len(text) > _base64_length(limit):
            raise PredictError(
                f"image {index} is larger than [node].predict_max_image_mb ({settings.predict_max_image_mb:g} MB)"
            )
        try:
            blobs.append(base64.b64decode(text, validate=True))
        except binascii.Error:
            raise PredictError(f"image {index} is not base64") from None
    return blobs


class LiveModel:
    """What the node's last evaluation scored, as a UsableModel, made once a round (its threshold
    costs a pass over the held-out images); `get` runs in worker threads."""

    def __init__(self, driver: Callable[[], RoundDriver | None], config: Config) -> None:
        self._driver, self.config = driver, config
        self._made: tuple[object, UsableModel] | None = None  # the predictors it was made of, and it

    def get(self) -> UsableModel:
        """PredictError while there is none."""
        driver = self._driver()
        if driver is None:
            raise PredictError("this node does not learn ([algorithm].name is none): it has no model")
        if driver.algorithm is None:
            raise PredictError("the node is still loading its data and model; try again in a moment")
        latest = driver.evaluated.latest()
        if latest is None:
            raise PredictError(
                f"no round finished yet (round {driver.round} in progress): the model is there after the first round"
            )
        round, predictors = latest
        made = self._made
        if made is None or made[0] is not predictors:  # a module handed out is never changed (EvaluatedModel)
            algorithm = driver.algorithm
            made = self._made = (
                predictors,
                UsableModel.of(predictors, algorithm.setup.data, self.config, algorithm.name, round),
            )
        return made[1]


# --- the command line's side ----------------------------------------------------------------


def _read_images(paths: Sequence[str], settings: NodeSettings) -> list[tuple[str, bytes | None, str | None]]:
    """(name, bytes, None) for each file that can be read, (name, None, why) for the others."""
    limit = max_image_bytes(settings)
    files = []
    for name in paths:
        try:
            with open(name, "rb") as file:
                blob = file.read(limit + 1)
        except OSError as exc:
            files.append((name, None, f"cannot be read: {describe_os_error(exc)}"))
            continue
        if len(blob) > limit:
            why = f"larger than [node].predict_max_image_mb ({settings.predict_max_image_mb:g} MB)"
            files.append((name, None, why))
        else:
            files.append((name, blob, None))
    return files


def predict_files(
    config: Config, paths: Sequence[str], full_config: Callable[[], Config], ask_peers: bool = False
) -> dict[str, Any]:
    """Classify the image files `paths`: by the running node, or, if none runs, from its
    checkpoint (`full_config()` then gives the configuration with its identity and learning
    checked). Every file gets an entry, in order: its class, the class's name and probability,
    whether it is one of the node's classes, and the round of the model that gave them; or an
    error. `ask_peers`: the running node asks its learning peers about the images it calls not
    one of its classes (asking.py)."""
    files = _read_images(paths, config.node)
    blobs = [blob for _, blob, _ in files if blob is not None]
    about: dict[str, Any] = {"source": None}
    results: list[dict[str, Any]] = []
    if blobs:
        try:
            about, results = _ask_node(config, blobs, ask_peers)
        except NotRunning:
            if ask_peers:
                raise PredictError(
                    "--ask-peers asks through the running node, and none runs with this configuration "
                    "(start it with `p2pnode start`, or leave --ask-peers out to use its checkpoint)"
                ) from None
            model = checkpoint_model(full_config())[0]
            about = {"source": "checkpoint", **model.about()}
            for start in range(0, len(blobs), _LOCAL_BATCH):
                results += [{**r, "round": model.round} for r in model.classify(blobs[start : start + _LOCAL_BATCH])]
    answers = iter(results)
    predictions = [{"file": name, **(next(answers) if error is None else {"error": error})} for name, _, error in files]
    return {**about, "predictions": predictions}


def _ask_node(config: Config, blobs: list[bytes], ask_peers: bool) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    per_request = config.node.predict_max_images
    about: dict[str, Any] = {"source": "node"}
    results, asked = [], []
    for start in range(0, len(blobs), per_request):
        images = [base64.b64encode(blob).decode() for blob in blobs[start : start + per_request]]
        try:
            answer = request(
                config.control_socket, PREDICT, timeout=PREDICT_TIMEOUT_S, images=images, ask_peers=ask_peers
            )
        except NotRunning:
            if start:
                raise PredictError("the node stopped while answering") from None
            raise
        except ControlError as exc:
            raise PredictError(str(exc)) from None
        if not answer.get("ok"):
            raise PredictError(f"the node refused: {answer.get('error')}")
        asked += answer.pop("asked", {}).get("peers", [])
        about.update((key, value) for key, value in answer.items() if key not in ("ok", "results"))
        results += [{**result, "round": answer["round"]} for result in answer["results"]]
    if ask_peers:
        about["asked"] = sorted(set(asked))
    return about, results


def checkpoint_model(config: Config) -> tuple[UsableModel, Checkpoint]:
    """The node's model as its checkpoint holds it, rebuilt as its configuration describes
    (its data is loaded: the model's input shape comes from it)."""
    from algorithms.models.inference import frozen

    from ..learning.algorithm import LearningSetupError, build_algorithm

    if config.algorithm.name == "none":
        raise PredictError("this node does not learn ([algorithm].name is none): it has no model")
    path = config.node.data_dir / CHECKPOINT_NAME
    if not path.exists():
        if _answers(config):
            raise PredictError(
                f"no checkpoint yet ({path} does not exist): the node runs but has not finished its first round; "
                "try again once it has (`p2pnode status` shows its rounds)"
            )
        raise PredictError(
            f"no checkpoint yet ({path} does not exist): no node runs with this configuration and none has "
            "finished a round here ([algorithm].checkpoint must be on); start it with `p2pnode start`"
        )
    try:
        saved = Checkpoint.load(path, config.algorithm.name)
        algorithm = build_algorithm(config, config.identity.node_id)
        algorithm.load_state_dict(saved.state)
    except (CheckpointError, LearningSetupError) as exc:
        raise PredictError(str(exc)) from None
    except (KeyError, ValueError) as exc:  # a model the configuration describes otherwise than the saved one
        raise PredictError(f"{path} does not fit the model [model] and [data] describe: {exc}") from None
    model = UsableModel.of(frozen(algorithm.predictors()), algorithm.setup.data, config, algorithm.name, saved.round)
    return model, saved


def _answers(config: Config) -> bool:
    """Whether a node runs with this configuration (its control socket answers)."""
    try:
        request(config.control_socket, "status", timeout=2.0)
    except ControlError:  # NotRunning among them
        return False
    return True


def export_model(config: Config, out: Path) -> dict[str, Any]:
    """Write the node's model (from its checkpoint) to `out` as a `torch.export` program on the
    CPU, for any batch size, with its metadata inside and in `out`.json; returns the metadata."""
    import torch

    if not out.parent.is_dir():  # said before the seconds of loading and tracing, not after
        raise PredictError(f"cannot write {out}: {out.parent} is not a folder (create it first)")

    model, saved = checkpoint_model(config)
    predictors = model.predictors.cpu()
    example = torch.zeros(2, *model.preprocessing.shape)
    batch = torch.export.Dim.DYNAMIC
    try:
        program = torch.export.export(predictors, (example,), dynamic_shapes=({0: batch},))
    except Exception as exc:  # torch.export names what it cannot trace in many exception types
        raise PredictError(f"torch.export cannot export this model ({type(exc).__name__}: {exc})") from None
    last = saved.history[-1] if saved.history else None
    metadata = {
        "format": EXPORT_FORMAT,
        "load": "torch.export.load(FILE).module()",
        "input": model.preprocessing.describe(),
        "output": "logits, N x classes; their softmax over dim 1 gives each class's probability",
        "class_names": list(model.class_names),
        **model.about(),
        "backbone": config.model.backbone,
        "accuracy": None if last is None else last.accuracy,
        "test_images": None if last is None else last.test_samples,
        "node_id": config.identity.node_id,
        "torch": torch.__version__,
    }
    text = json.dumps(metadata, indent=2)
    buffer = io.BytesIO()
    torch.export.save(program, buffer, extra_files={METADATA_NAME: text})
    try:
        write_atomically(out, buffer.getvalue(), mode=0o644)
        write_atomically(out.with_name(out.name + ".json"), (text + "\n").encode(), mode=0o644)
    except OSError as exc:
        raise PredictError(f"cannot write {out}: {describe_os_error(exc)}") from None
    return metadata
