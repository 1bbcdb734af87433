"""A task trains only the weights its outputs depend on.

A task reads some of its backbone's outputs: a masked LM reads
`sequence_output`, not BERT's `pooled_output`; ViLBERT's region scorer reads
the visual stream only. The backbone still holds the weights of the outputs
it does not read (the pooler; the text stream's last layers), and Keras
trains every trainable weight of a model. Their gradient is then

    ∂loss/∂w = 0 for every w that no output read depends on,

which each backend treats in its own way. torch and TensorFlow find no
gradient, skip the weights and warn on every step ("Gradients do not exist
for variables ['pooler/kernel', 'pooler/bias'] when minimizing the loss");
JAX finds zeros and applies them, so AdamW's weight decay shrinks the
weights. The same `fit` then ends with different weights on each backend.

`TrainsOnlyUsedWeights` counts the weights of the layers the task's outputs
do not depend on (`Backbone.unused_layers`) as non-trainable in this task,
on every backend: the optimizer neither updates nor decays them, no warning
is raised, and the backend's step still gets them as state. The weights
stay trainable on the backbone itself (their `trainable` flag is not
touched), so a later task on the same backbone (a classifier that reads the
pooler) trains them. `transformers` gets the same effect by building
`BertForMaskedLM` without the pooler.
"""


class TrainsOnlyUsedWeights:
    """Mixin for tasks: the weights of `unused_layers` are non-trainable in
    this model (see the module docstring).

    A subclass names the backbone outputs its head reads in the class
    attribute `backbone_outputs` (`None`, the default, for all of them); the
    unused layers are found once, when the model is built.

    Example:

    >>> from attention_zoo_keras.models import BertBackbone, BertMaskedLM
    >>> backbone = BertBackbone(vocabulary_size=30, num_layers=1, num_heads=2, hidden_dim=8,
    ...                         intermediate_dim=16, max_sequence_length=16)
    >>> mlm = BertMaskedLM(backbone)
    >>> [layer.name for layer in mlm.unused_layers]
    ['pooler']
    >>> [v.path for v in mlm.trainable_weights if v.path.startswith("pooler")]
    []
    >>> [v.path for v in backbone.trainable_weights if v.path.startswith("pooler")]
    ['pooler/kernel', 'pooler/bias']
    """

    backbone_outputs = None

    def _find_unused_layers(self, backbone):
        """Notes the layers of `backbone` that no output in
        `backbone_outputs` depends on (kept out of Keras' layer tracking)."""
        unused = () if self.backbone_outputs is None else tuple(backbone.unused_layers(self.backbone_outputs))
        self.__dict__["_unused_layers"] = unused

    @property
    def unused_layers(self):
        """The backbone's layers that this task's outputs do not depend on."""
        return self.__dict__.get("_unused_layers", ())

    def _split(self, trainable):
        """`trainable` (variables Keras trains) as `(used, unused)`."""
        unused_ids = {id(weight) for layer in self.unused_layers for weight in layer.weights}
        used = [variable for variable in trainable if id(variable) not in unused_ids]
        unused = [variable for variable in trainable if id(variable) in unused_ids]
        return used, unused

    @property
    def trainable_weights(self):
        return self._split(super().trainable_weights)[0]

    @property
    def trainable_variables(self):
        return self._split(super().trainable_variables)[0]

    @property
    def non_trainable_weights(self):
        return super().non_trainable_weights + self._split(super().trainable_weights)[1]

    @property
    def non_trainable_variables(self):
        return super().non_trainable_variables + self._split(super().trainable_variables)[1]
