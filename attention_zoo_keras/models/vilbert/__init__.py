"""ViLBERT (Lu et al., 2019): the two-stream vision-and-language backbone
with co-attention, and the mapping of the authors' checkpoints."""

from attention_zoo_keras.models.vilbert.vilbert_backbone import ViLBERTBackbone
from attention_zoo_keras.models.vilbert.vilbert_visual_question_answerer import ViLBERTVisualQuestionAnswerer
