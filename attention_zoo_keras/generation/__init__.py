"""Decoding: samplers, the in-place decoding loop and beam search."""

from attention_zoo_keras.generation.beam_search import BeamOptions
from attention_zoo_keras.generation.decoding_state import DecodingState
from attention_zoo_keras.generation.in_place_decoding import decode_in_place
from attention_zoo_keras.generation.in_place_decoding import sampling_body
from attention_zoo_keras.generation.samplers import GreedySampler
from attention_zoo_keras.generation.samplers import Sampler
from attention_zoo_keras.generation.samplers import TemperatureSampler
from attention_zoo_keras.generation.samplers import TopKSampler
from attention_zoo_keras.generation.samplers import TopPSampler
from attention_zoo_keras.generation.samplers import get_sampler
from attention_zoo_keras.generation.samplers import sampler_names
from attention_zoo_keras.generation.samplers import sampler_option_names
