"""Pure domain of the notifier: values, validation, the push-adapter interface. No I/O."""
