"""The one place that knows which backend Keras runs on.

Everything else in the library is written against `keras.ops`. The questions
whose answer depends on the backend live here, one concern per module:

- `environment`: the backend, whether a value is concrete (so
  its contents can be checked before entering a compiled graph);
- `activation_kernels`: the exact GELU in the form each backend computes
  fastest;
- `attention_kernels`: calling the fused attention kernels (under JAX on a
  GPU, with each row's key length);
- `dense_kernels`: dense projections and layer normalization as one fused
  kernel each (and a single row's projection kept a matrix product);
- `compiled_decoding`: compiled decoding loops, in-place buffer writes;
- `recorded_steps`: model steps (forward, decoding, training) recorded once
  per input signature and replayed on torch;
- `cuda_graphs`: a recorded step replayed as one captured CUDA graph;
- `fused_optimizers`: optimizer updates as one fused kernel, gradients dense;
- `gradients`: vector-Jacobian products and custom gradients;
- `randomness`: the backend's own global generator, seeded;
- `sorting`: sorting that every backend's exporter converts;
- `keras_workarounds`: help Keras needs (training loops, LiteRT export,
  variables read in their own dtype where a layer asks for it);
- `jax_trainer_state`: Keras' JAX trainer state passed to and from the
  compiled steps without walking the model at every step;
- `variable_initialization`: variables created holding a checkpoint's
  values (straight into their shards under a distribution).

Backend modules are imported only when they are the active backend, so
importing this library under JAX or PyTorch never imports TensorFlow.
"""

from attention_zoo_keras.backend_support.activation_kernels import exact_gelu
from attention_zoo_keras.backend_support.attention_kernels import encoders_move_padding_last
from attention_zoo_keras.backend_support.attention_kernels import fused_dot_product_attention
from attention_zoo_keras.backend_support.attention_kernels import mask_for_fused_attention
from attention_zoo_keras.backend_support.attention_kernels import native_fused_attention
from attention_zoo_keras.backend_support.compiled_decoding import apply_when
from attention_zoo_keras.backend_support.compiled_decoding import compile_inference
from attention_zoo_keras.backend_support.compiled_decoding import decoding_cache_sizes
from attention_zoo_keras.backend_support.compiled_decoding import decoding_while_loop
from attention_zoo_keras.backend_support.compiled_decoding import fill_columns
from attention_zoo_keras.backend_support.compiled_decoding import marked_columns
from attention_zoo_keras.backend_support.compiled_decoding import materialize
from attention_zoo_keras.backend_support.compiled_decoding import reorder_rows
from attention_zoo_keras.backend_support.compiled_decoding import write_rows
from attention_zoo_keras.backend_support.dense_kernels import dense_projection
from attention_zoo_keras.backend_support.dense_kernels import layer_normalization
from attention_zoo_keras.backend_support.environment import backend_name
from attention_zoo_keras.backend_support.environment import compiles_loop_bodies_apart
from attention_zoo_keras.backend_support.environment import is_concrete
from attention_zoo_keras.backend_support.environment import relaxes_traced_shapes
from attention_zoo_keras.backend_support.environment import supports_custom_gradients
from attention_zoo_keras.backend_support.fused_optimizers import dense_gradient
from attention_zoo_keras.backend_support.fused_optimizers import fused_adam_update
from attention_zoo_keras.backend_support.gradients import custom_gradient_from_outputs
from attention_zoo_keras.backend_support.gradients import vjp
from attention_zoo_keras.backend_support.jax_trainer_state import JaxTrainerState
from attention_zoo_keras.backend_support.keras_workarounds import batches_of_any_width
from attention_zoo_keras.backend_support.keras_workarounds import litert_export_settings
from attention_zoo_keras.backend_support.keras_workarounds import variables_in_their_own_dtype
from attention_zoo_keras.backend_support.keras_workarounds import variables_restored_on_error
from attention_zoo_keras.backend_support.randomness import seeded_global_random
from attention_zoo_keras.backend_support.recorded_steps import compile_step
from attention_zoo_keras.backend_support.recorded_steps import compile_training_step
from attention_zoo_keras.backend_support.sorting import argsort_distinct
from attention_zoo_keras.backend_support.variable_initialization import initialized_from
from attention_zoo_keras.backend_support.variable_initialization import is_integer_dtype

__all__ = [
    "JaxTrainerState",
    "apply_when",
    "argsort_distinct",
    "backend_name",
    "batches_of_any_width",
    "compile_inference",
    "compile_step",
    "compile_training_step",
    "compiles_loop_bodies_apart",
    "custom_gradient_from_outputs",
    "decoding_cache_sizes",
    "decoding_while_loop",
    "dense_gradient",
    "dense_projection",
    "encoders_move_padding_last",
    "exact_gelu",
    "fill_columns",
    "fused_adam_update",
    "fused_dot_product_attention",
    "initialized_from",
    "is_integer_dtype",
    "is_concrete",
    "layer_normalization",
    "litert_export_settings",
    "marked_columns",
    "mask_for_fused_attention",
    "materialize",
    "native_fused_attention",
    "relaxes_traced_shapes",
    "reorder_rows",
    "seeded_global_random",
    "supports_custom_gradients",
    "vjp",
    "variables_in_their_own_dtype",
    "variables_restored_on_error",
    "write_rows",
]
