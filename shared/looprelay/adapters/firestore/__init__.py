"""The cloud store's adapters: Firestore behind the store ports."""
