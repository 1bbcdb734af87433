"""Preset handles, hub downloads, the native preset format and model cards."""

from attention_zoo_keras.hub.catalog import UnknownPresetError
from attention_zoo_keras.hub.catalog import list_presets
from attention_zoo_keras.hub.source import PresetFileError
from attention_zoo_keras.hub.source import PresetSource
from attention_zoo_keras.hub.upload import PresetUploadError
from attention_zoo_keras.hub.upload import upload_preset
