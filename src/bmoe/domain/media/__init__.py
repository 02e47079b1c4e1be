"""Images in a prompt: the picture a request carries, where it sits in the text, and how
its embedding rows stand in a token sequence (pure values and policy; mtmd is in
``bmoe.adapters.llama.vision``)."""

from bmoe.domain.media.image_rows import ImageRows, image_row_ids, is_image_row
from bmoe.domain.media.images import MEDIA_MARKER, Image, count_markers

__all__ = ["MEDIA_MARKER", "Image", "ImageRows", "count_markers", "image_row_ids", "is_image_row"]
