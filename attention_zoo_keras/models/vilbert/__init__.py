"""ViLBERT (Lu et al., 2019): the two-stream vision-and-language backbone
with co-attention, its pretraining and task heads, its preprocessors, and
the mapping of the authors' checkpoints."""

from attention_zoo_keras.models.vilbert.vilbert_backbone import ViLBERTBackbone
from attention_zoo_keras.models.vilbert.vilbert_grid_regions import image_grid_regions
from attention_zoo_keras.models.vilbert.vilbert_image_text_retriever import ViLBERTImageTextRetriever
from attention_zoo_keras.models.vilbert.vilbert_preprocessor import ViLBERTPreprocessor
from attention_zoo_keras.models.vilbert.vilbert_preprocessor import ViLBERTRetrievalPreprocessor
from attention_zoo_keras.models.vilbert.vilbert_pretrainer import ViLBERTPretrainer
from attention_zoo_keras.models.vilbert.vilbert_pretrainer_preprocessor import ViLBERTPretrainerPreprocessor
from attention_zoo_keras.models.vilbert.vilbert_region_inputs import grid_boxes
from attention_zoo_keras.models.vilbert.vilbert_region_inputs import region_inputs
from attention_zoo_keras.models.vilbert.vilbert_region_scorer import ViLBERTRegionScorer
from attention_zoo_keras.models.vilbert.vilbert_visual_question_answerer import ViLBERTVisualQuestionAnswerer
