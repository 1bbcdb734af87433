"""attention_zoo_keras: the attention architectures that shaped deep learning,
written once against `keras.ops` for JAX, TensorFlow and PyTorch.

Example:

>>> import attention_zoo_keras as azk                                   # doctest: +SKIP
>>> clf = azk.models.BertTextClassifier.from_preset("bert_base", num_classes=2)  # doctest: +SKIP
>>> clf.fit(["a great film", "dull and long"], [1, 0], epochs=1)        # doctest: +SKIP
"""

from attention_zoo_keras import attention
from attention_zoo_keras import generation
from attention_zoo_keras import hub
from attention_zoo_keras import layers
from attention_zoo_keras import losses
from attention_zoo_keras import metrics
from attention_zoo_keras import models
from attention_zoo_keras import optimizers
from attention_zoo_keras import tokenizers
from attention_zoo_keras import training
from attention_zoo_keras.hub.catalog import list_presets
from attention_zoo_keras.hub.upload import upload_preset
from attention_zoo_keras.layers.attention_maps import attention_maps
from attention_zoo_keras.plotting import plot_attention
from attention_zoo_keras.version import __version__
