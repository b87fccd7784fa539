"""What the response models share: the base class, the item config, aliases."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

# ``extra="allow"``: a shape names what is there today without promising
# that nothing will ever be added.
ITEM = ConfigDict(extra="allow")


class Out(BaseModel):
    model_config = ITEM


Hashes = list[str]
Ids = list[int]
PerGroupIds = list[list[int]]
