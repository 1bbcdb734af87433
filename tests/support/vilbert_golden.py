"""The ViLBERT golden fixture (`tests/fixtures/vilbert`, see its README):
where it lies (`FIXTURE`), its tensors (`load`), and its inputs in this
library's names (`our_inputs`)."""

from pathlib import Path

from safetensors.numpy import load_file

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "vilbert"


def load(name):
    """`{name: array}` of the fixture's `name.safetensors`."""
    return load_file(str(FIXTURE / f"{name}.safetensors"))


def our_inputs(theirs):
    """The fixture's inputs (the authors' names) as `ViLBERTBackbone` inputs."""
    return {
        "token_ids": theirs["input_ids"].astype("int32"),
        "segment_ids": theirs["token_type_ids"].astype("int32"),
        "padding_mask": theirs["attention_mask"].astype("int32"),
        "region_features": theirs["image_feat"],
        "region_boxes": theirs["image_loc"],
        "region_mask": theirs["image_attention_mask"].astype("int32"),
    }
