"""Input formats shared by the apps.

``libsvm``: streaming LIBSVM/svmlight reader (labels plus sparse ``idx:val``
features) that splits rows into a job's input blocks, and a fast writer used
by the data generators.
"""
