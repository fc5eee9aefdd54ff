"""Phase 1, OCR: documents are expanded into pages; each page becomes `page_NNNN_nohf.md`."""

import dagster as dg
from dagster import AssetExecutionContext, OpExecutionContext, SensorEvaluationContext

from queue_db.phases import OCR_DOCUMENT, OCR_PAGE, Level
from orchestration.cluster import celery_queue_tags
from orchestration.assets.common import materialize_range
from orchestration.pipeline import Pipeline
from orchestration.partitions import documents_partitions, pages_partitions, register_partitions
from resources.database import DatabaseResource
from resources.ocr import OcrResource
from resources.storage import StorageResource

SINGLE_RUN = dg.BackfillPolicy.single_run()


@dg.asset(
    name="ocr_document", group_name="ocr", partitions_def=documents_partitions, backfill_policy=SINGLE_RUN,
    output_required=False, kinds={"pymupdf", "postgres"}, owners=["team:docqueue"], tags={"docqueue/phase": "ocr"},
    pool="ocr", op_tags=celery_queue_tags("ocr"),
    description="Opens the PDF (password from its reference if any), checks the limits, counts its pages and "
                "creates one OCR task and one `pages` partition per page. Fails with a readable reason for "
                "corrupt, encrypted, empty or oversized files.",
)
def ocr_document(context: AssetExecutionContext, database: DatabaseResource, storage: StorageResource,
                 ocr: OcrResource):
    pipeline = Pipeline.from_resources(database.get_queue(), storage, ocr=ocr)
    yield from materialize_range(
        context, OCR_DOCUMENT, pipeline.queue, pipeline,
        after=lambda report: register_partitions(context.instance, pipeline.queue.engine, Level.PAGE))


@dg.asset(
    name="ocr_page", group_name="ocr", partitions_def=pages_partitions, backfill_policy=SINGLE_RUN,
    output_required=False, kinds={"pymupdf", "postgres"}, owners=["team:docqueue"], tags={"docqueue/phase": "ocr"},
    pool="ocr", op_tags=celery_queue_tags("ocr"),
    deps=[dg.AssetDep("ocr_document", partition_mapping=dg.AllPartitionMapping())],
    description="Converts one page to markdown: the text layer when the page has one (headings, lists and tables "
                "kept), RapidOCR when it has none; repeated headers/footers and page numbers removed. "
                "Metadata per page: method, characters, seconds.",
)
def ocr_page(context: AssetExecutionContext, database: DatabaseResource, storage: StorageResource,
             ocr: OcrResource):
    pipeline = Pipeline.from_resources(database.get_queue(), storage, ocr=ocr)
    yield from materialize_range(context, OCR_PAGE, pipeline.queue, pipeline)


ocr_assets = [ocr_document, ocr_page]
