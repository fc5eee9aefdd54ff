from .graphrag import graphrag_assets
from .ocr import ocr_assets
from .rollups import rollup_assets
from .vector import vector_assets

all_assets = [*ocr_assets, *vector_assets, *graphrag_assets, *rollup_assets]
