# Firestore (native mode): the database, the composite indexes the adapters' queries need, and
# TTL policies. Collections and fields: docs/architecture.md and the docstrings of
# shared/looprelay/adapters/firestore_*.py.

resource "google_firestore_database" "main" {
  project     = var.project
  name        = var.firestore_database
  location_id = local.firestore_location
  type        = "FIRESTORE_NATIVE"
  # The adapters write under update-time preconditions and never hold locks.
  concurrency_mode                  = "OPTIMISTIC"
  point_in_time_recovery_enablement = "POINT_IN_TIME_RECOVERY_ENABLED"
  delete_protection_state           = "DELETE_PROTECTION_ENABLED"

  depends_on = [google_project_service.enabled]
}

locals {
  # Composite indexes, by the query that needs each (fields in order; ASC/DESC).
  # Equality filters combined with one another (events by delivery AND name) are served by
  # merging these indexes, which Firestore does for equality filters on the same order.
  composite_indexes = {
    # FirestoreStore.list_deliveries: outcome ==, newest first.
    deliveries_by_outcome = {
      collection = "deliveries"
      fields     = [["outcome", "ASCENDING"], ["received_at", "DESCENDING"]]
    }
    # FirestoreStore.list_deliveries(outcome="refused"): every refused:<reason>.
    deliveries_by_outcome_kind = {
      collection = "deliveries"
      fields     = [["outcome_kind", "ASCENDING"], ["received_at", "DESCENDING"]]
    }
    # FirestoreStore.list_inbox: one issue's unsettled deliveries, smallest key first.
    deliveries_by_order = {
      collection = "deliveries"
      fields     = [["order_group", "ASCENDING"], ["outcome", "ASCENDING"], ["order_key", "ASCENDING"]]
    }
    # FirestoreStore.list_events: one equality filter, then sort_key (and sort_key > after).
    events_by_delivery = {
      collection = "events"
      fields     = [["delivery_id", "ASCENDING"], ["sort_key", "ASCENDING"]]
    }
    events_by_work_item = {
      collection = "events"
      fields     = [["work_item", "ASCENDING"], ["sort_key", "ASCENDING"]]
    }
    events_by_name = {
      collection = "events"
      fields     = [["name", "ASCENDING"], ["sort_key", "ASCENDING"]]
    }
    # FirestoreStore.list_events(after=...): one equality filter, then the commit time.
    events_by_delivery_written = {
      collection = "events"
      fields     = [["delivery_id", "ASCENDING"], ["written_at", "ASCENDING"]]
    }
    events_by_work_item_written = {
      collection = "events"
      fields     = [["work_item", "ASCENDING"], ["written_at", "ASCENDING"]]
    }
    events_by_name_written = {
      collection = "events"
      fields     = [["name", "ASCENDING"], ["written_at", "ASCENDING"]]
    }
    # ... and newest first, for what was committed shortly before the cursor.
    events_by_delivery_written_desc = {
      collection = "events"
      fields     = [["delivery_id", "ASCENDING"], ["written_at", "DESCENDING"]]
    }
    events_by_work_item_written_desc = {
      collection = "events"
      fields     = [["work_item", "ASCENDING"], ["written_at", "DESCENDING"]]
    }
    events_by_name_written_desc = {
      collection = "events"
      fields     = [["name", "ASCENDING"], ["written_at", "DESCENDING"]]
    }
    # FirestoreStore.list_events(newest=True): the same, newest first (`looprelay events`).
    events_by_delivery_newest = {
      collection = "events"
      fields     = [["delivery_id", "ASCENDING"], ["sort_key", "DESCENDING"]]
    }
    events_by_work_item_newest = {
      collection = "events"
      fields     = [["work_item", "ASCENDING"], ["sort_key", "DESCENDING"]]
    }
    events_by_name_newest = {
      collection = "events"
      fields     = [["name", "ASCENDING"], ["sort_key", "DESCENDING"]]
    }
    # FirestoreWorkItemStore.list_dispatches: ordered by created_at then seq, with no filter
    # (`looprelay` listing all), status IN (the lease desk), work_item ==, or both.
    dispatches_in_order = {
      collection = "dispatches"
      fields     = [["created_at", "ASCENDING"], ["seq", "ASCENDING"]]
    }
    dispatches_by_status = {
      collection = "dispatches"
      fields     = [["status", "ASCENDING"], ["created_at", "ASCENDING"], ["seq", "ASCENDING"]]
    }
    dispatches_by_work_item = {
      collection = "dispatches"
      fields     = [["work_item", "ASCENDING"], ["created_at", "ASCENDING"], ["seq", "ASCENDING"]]
    }
    # FirestoreWorkItemStore.list_dispatch_heads(repositories=...): what one runner serves.
    dispatches_by_status_and_repository = {
      collection = "dispatches"
      fields = [
        ["status", "ASCENDING"], ["repository_key", "ASCENDING"],
        ["created_at", "ASCENDING"], ["seq", "ASCENDING"],
      ]
    }
    dispatches_by_status_and_work_item = {
      collection = "dispatches"
      fields = [
        ["status", "ASCENDING"], ["work_item", "ASCENDING"],
        ["created_at", "ASCENDING"], ["seq", "ASCENDING"],
      ]
    }
  }

  # Collections whose documents carry expires_at (write time + retention, or a registration
  # token's own expiry) for a TTL policy.
  ttl_collections = ["deliveries", "events", "registration_tokens", "runner_changes"]

  # Large fields nothing queries on: no single-field index (saves index writes and storage).
  # A runner's liveness document is read by id or whole, never queried, and rewritten on
  # every heartbeat: an index of its one timestamp, which only grows, serves nothing and
  # would be a write hotspot.
  unindexed_fields = {
    deliveries_envelope  = { collection = "deliveries", field = "envelope" }
    events_data          = { collection = "events", field = "data" }
    runner_liveness_seen = { collection = "runner_liveness", field = "last_seen_at" }
  }
}

resource "google_firestore_index" "composite" {
  for_each = local.composite_indexes

  project    = var.project
  database   = google_firestore_database.main.name
  collection = "${var.collection_prefix}${each.value.collection}"

  dynamic "fields" {
    for_each = each.value.fields
    content {
      field_path = fields.value[0]
      order      = fields.value[1]
    }
  }
}

# Firestore deletes a document typically within 24 hours after expires_at passes; until then it
# still shows in queries, which the adapters allow for. The field is also exempt from indexing:
# a timestamp that only grows would make its index a write hotspot.
resource "google_firestore_field" "ttl" {
  for_each = toset(local.ttl_collections)

  project    = var.project
  database   = google_firestore_database.main.name
  collection = "${var.collection_prefix}${each.value}"
  field      = "expires_at"

  ttl_config {}
  index_config {}
}

resource "google_firestore_field" "unindexed" {
  for_each = local.unindexed_fields

  project    = var.project
  database   = google_firestore_database.main.name
  collection = "${var.collection_prefix}${each.value.collection}"
  field      = each.value.field

  index_config {}
}
