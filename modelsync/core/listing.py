"""One page of an S3 ListObjectsV2 answer, read from its XML: the keys, sizes and ETags of a prefix.

The data-plane store lists a model without a manifest itself (the S3 SDK costs a cold pull
half a second to import). It asks, as botocore does, for `encoding-type=url`, so a key that XML
cannot carry (control characters) still arrives; keys are decoded only when the answer says
it encoded them. Anything that is not a well-formed page is None: the caller then asks the
SDK, whose answer and errors are the reference.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import NamedTuple
from urllib.parse import unquote

from modelsync.core.parts import ObjectInfo

#: the query of a listing of `prefix`, as botocore sends it (and so signs it)
LIST_PARAMS = {"list-type": "2", "encoding-type": "url"}


class ListPage(NamedTuple):
    objects: tuple[ObjectInfo, ...]
    #: where the next page starts; None on the last page
    next_token: str | None


def list_params(prefix: str, token: str | None) -> dict[str, str]:
    """The query parameters of one page's request."""
    params = {**LIST_PARAMS, "prefix": prefix}
    if token is not None:
        params["continuation-token"] = token
    return params


def parse_list_page(body: bytes) -> ListPage | None:
    """The page in `body`, or None when it is not a ListBucketResult this reader understands."""
    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        return None
    if _local(root.tag) != "ListBucketResult":
        return None
    fields = {_local(child.tag): child for child in root}
    encoded = (_text(fields.get("EncodingType")) or "").lower() == "url"
    objects = []
    for item in root:
        if _local(item.tag) != "Contents":
            continue
        got = {_local(child.tag): _text(child) for child in item}
        key, size, etag = got.get("Key"), got.get("Size"), got.get("ETag")
        if key is None or size is None or not size.isdigit() or etag is None:
            return None
        objects.append(ObjectInfo(unquote(key) if encoded else key, int(size), etag.strip('"')))
    truncated = (_text(fields.get("IsTruncated")) or "false").lower() == "true"
    token = _text(fields.get("NextContinuationToken"))
    if truncated and not token:
        return None
    return ListPage(tuple(objects), token if truncated else None)


def _local(tag: str) -> str:
    """A tag without its namespace (S3's is http://s3.amazonaws.com/doc/2006-03-01/)."""
    return tag.rpartition("}")[2]


def _text(element: ET.Element | None) -> str | None:
    return None if element is None else (element.text or "")
