"""Request bodies of the routes (pydantic), in the shapes of the APIs they are compatible with: OpenAI
(/v1/embeddings), text-embeddings-inference (/embed, /rerank, /predict, /tokenize) and Cohere/Jina (/v1/rerank).
Unknown fields are ignored, as those servers ignore them; types are strict (no "1" for 1, no true for 1)."""
from __future__ import annotations

from typing import Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

TokenIds = list[StrictInt]
Direction = Literal["right", "left", "Right", "Left"]


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class OpenAIEmbeddingRequest(_Body):
    input: Union[StrictStr, list[StrictStr], TokenIds, list[TokenIds]]
    model: StrictStr | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: StrictInt | None = Field(None, gt=0)
    user: StrictStr | None = None


class EmbedRequest(_Body):
    inputs: Union[StrictStr, TokenIds, list[Union[StrictStr, TokenIds]]]
    normalize: StrictBool = True
    truncate: StrictBool | None = None
    truncation_direction: Direction = "right"
    dimensions: StrictInt | None = Field(None, gt=0)


class RerankRequest(_Body):
    query: StrictStr
    texts: list[StrictStr]
    raw_scores: StrictBool = False
    return_text: StrictBool = False
    truncate: StrictBool | None = None
    truncation_direction: Direction = "right"


class CohereRerankRequest(_Body):
    query: StrictStr
    documents: list[Union[StrictStr, dict[StrictStr, StrictStr]]]
    model: StrictStr | None = None
    top_n: StrictInt | None = Field(None, gt=0)
    return_documents: StrictBool = False


class PredictRequest(_Body):
    """inputs: a text, a pair [a, b] (two strings alone are one pair, as TEI reads them), or a list of texts and
    pairs [[a, b], ...]."""
    inputs: Union[StrictStr, list[Union[StrictStr, list[StrictStr]]]]
    raw_scores: StrictBool = False
    truncate: StrictBool | None = None
    truncation_direction: Direction = "right"


class TokenizeRequest(_Body):
    inputs: Union[StrictStr, list[StrictStr]]
    add_special_tokens: StrictBool = True


def body_schema(model: type[BaseModel]) -> dict:
    """An openapi_extra entry declaring `model` as the JSON request body (the routes parse the body themselves)."""
    return {"requestBody": {"required": True,
                            "content": {"application/json": {"schema": model.model_json_schema()}}}}
